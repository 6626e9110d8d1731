//! The types openraft is instantiated with.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::spool::Applied;

/// A Raft answer as the replication port carries it (`server.rs` writes
/// it, `client.rs` reads it): the value, or the text of the peer's error.
/// The text, not a type: the error is whatever the peer's openraft and
/// build made of it, and the caller only hands it on to openraft as a
/// network error.
pub(crate) type WireAnswer<T> = Result<T, String>;

/// One spoold record as Raft carries it: the record's kind and body, the
/// bytes every replica writes into its journal as they are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RecordData {
    pub kind: u8,
    pub body: Vec<u8>,
}

impl fmt::Display for RecordData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "record kind {} ({} bytes)", self.kind, self.body.len())
    }
}

/// A replica as the membership names it: where its replication listener
/// is (`cluster.peers`), which spool directory answers there, and where
/// its API is. The incarnation and the API URL are what the member's
/// signed answers said (`client.rs`), written into the membership by the
/// primary (`members.rs`): a follower relays only to the API URL that the
/// membership Raft agreed on names for the primary.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Peer {
    pub raft_addr: String,
    /// The incarnation of the member's spool directory (`files.rs`): a
    /// replica whose directory was wiped has a new one and refuses what is
    /// meant for the old (it must be removed and added back). 0 until the
    /// primary pins it: the members of a bootstrap are known by address
    /// only at first.
    pub incarnation: u64,
    /// The member's `cluster.api_url`; empty until the primary pins it.
    pub api_url: String,
}

openraft::declare_raft_types!(
    /// spoold's Raft: records as entries, what applying one did as the
    /// answer, one leader per term (a term names one primary).
    pub(crate) TypeConfig:
        D = RecordData,
        R = Applied,
        Node = Peer,
        LeaderId = openraft::impls::leader_id_std::LeaderId<u64, u64>,
);

pub(crate) type Entry = openraft::Entry<
    <<TypeConfig as openraft::RaftTypeConfig>::LeaderId as openraft::vote::RaftLeaderId>::Committed,
    <TypeConfig as openraft::RaftTypeConfig>::Payload,
>;
pub(crate) type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub(crate) type Vote = openraft::alias::VoteOf<TypeConfig>;
pub(crate) type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;

/// A record's sequence number from its Raft index: openraft counts from 0
/// (its first membership), the journal from 1 (0 means "none").
pub(crate) fn seq_of(index: u64) -> u64 {
    index + 1
}

/// The Raft index of record `seq`.
pub(crate) fn index_of(seq: u64) -> u64 {
    seq - 1
}
