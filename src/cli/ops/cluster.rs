//! `spoold cluster status|add|remove`: a replica's view of its cluster
//! (`GET /v1/cluster`, `src/api/cluster.rs`), and membership changes,
//! which the primary makes and answers with the cluster as it sees it.

use std::io::Write;
use std::time::Duration;

use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::client::{OpsError, Target};
use super::{json_lines, or_dash, table};
use crate::cli::term::Terminal;

/// The cluster as one replica sees it (the fields shown).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClusterStatus {
    node_id: u64,
    /// `primary`, `follower`, `candidate` or `learner`.
    role: String,
    term: u64,
    /// None until this replica knows one.
    primary: Option<Primary>,
    commit_index: Option<u64>,
    members: Vec<Member>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Primary {
    node_id: u64,
    /// None until this replica has heard from the primary.
    api_url: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Member {
    node_id: u64,
    /// Its replication address.
    addr: String,
    voter: bool,
    match_index: Option<u64>,
    lag_records: Option<u64>,
}

/// A member to add (`POST /v1/cluster/members`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AddMember<'a> {
    node_id: u64,
    addr: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    catch_up_timeout_secs: Option<u64>,
}

/// `spoold cluster status`: this replica's view of its cluster, as a
/// table of members (or the JSON of `GET /v1/cluster`).
pub async fn cluster_status(
    target: &Target,
    json: bool,
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    let answer: Value = target.call(Method::GET, "/v1/cluster").await?;
    show(target, answer, json, out)
}

/// `spoold cluster add ID ADDR`: adds a member through the primary and
/// waits until it is a voter (up to `catch_up` for it to catch up).
pub async fn cluster_add(
    target: &Target,
    (id, addr): (u64, &str),
    catch_up: Option<Duration>,
    json: bool,
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    let member = AddMember {
        node_id: id,
        addr,
        catch_up_timeout_secs: catch_up.map(|wait| wait.as_secs().max(1)),
    };
    let request = target
        .request(Method::POST, "/v1/cluster/members")
        .json(&member);
    let answer: Value = target.answer(request).await?;
    show(target, answer, json, out)
}

/// `spoold cluster remove ID`: removes a member through the primary.
pub async fn cluster_remove(
    target: &Target,
    id: u64,
    json: bool,
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    let answer: Value = target
        .call(Method::DELETE, &format!("/v1/cluster/members/{id}"))
        .await?;
    show(target, answer, json, out)
}

/// The answer of `GET /v1/cluster` (or of a membership change) as a line
/// about this replica and a table of members, or as one line of JSON.
fn show(
    target: &Target,
    answer: Value,
    json: bool,
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    if json {
        return json_lines(out, &[answer]);
    }
    let status: ClusterStatus = target.decode(answer)?;
    let primary = match &status.primary {
        None => "none known".to_string(),
        Some(p) => format!(
            "node {} ({})",
            p.node_id,
            p.api_url.as_deref().unwrap_or("address not known yet")
        ),
    };
    writeln!(
        out,
        "node {}: {} in term {}; primary: {primary}; commit index {}",
        status.node_id,
        status.role,
        status.term,
        or_dash(status.commit_index),
    )?;
    let rows: Vec<Vec<String>> = status.members.iter().map(Member::row).collect();
    table::write(out, &["NODE", "ADDR", "ROLE", "MATCH", "LAG"], &rows)
}

impl Member {
    fn row(&self) -> Vec<String> {
        let role = if self.voter { "voter" } else { "learner" };
        vec![
            self.node_id.to_string(),
            self.addr.clone(),
            role.to_string(),
            or_dash(self.match_index),
            or_dash(self.lag_records),
        ]
    }
}
