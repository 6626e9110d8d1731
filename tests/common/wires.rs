//! The replication links as TCP sees them: each replica's replication
//! listener is reached by the others through a TCP proxy of its own, which
//! tells the sender of a connection by the `spooler-cluster-from` header
//! of its first request and then passes bytes. Each direction of each
//! link is up, reset or a blackhole, on its own: the bytes a connection
//! opened by `a` carries to `b` travel `a → b`, its answers `b → a`.
//!
//! - A reset closes every connection that travels that direction with an
//!   RST at the end whose bytes met it, and resets the ones opened while
//!   it lasts. The other end is told nothing (a middlebox that forgot the
//!   connection answers only what reaches it): it stays open until it
//!   sends a byte, which is answered with an RST, or closes. An idle
//!   keep-alive connection on a listener is such an end.
//! - A blackhole accepts and holds the bytes of that direction (the
//!   proxy stops reading them, so they wait in the kernel's buffers and
//!   then the sender's, as on a path that drops packets), until the
//!   direction is up again: then they pass, late.
//!
//! Unlike `links.rs`, which swallows whole HTTP requests, this is the
//! network that flapping links are made of: connections that stay open
//! with nothing coming back, and closes nobody hears.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// What one direction of a link does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    Up,
    Reset,
    Blackhole,
}

/// The directions of the links between replicas, `(from, to)`, that are
/// not up.
#[derive(Clone, Default)]
pub struct Wires(Arc<Mutex<BTreeMap<(u64, u64), Way>>>);

/// How often a held direction looks again whether it may pass.
const POLL: Duration = Duration::from_millis(20);

impl Wires {
    /// Sets the direction `from → to`.
    pub fn set(&self, from: u64, to: u64, way: Way) {
        let mut ways = self.0.lock().unwrap();
        if way == Way::Up {
            ways.remove(&(from, to));
        } else {
            ways.insert((from, to), way);
        }
    }

    pub fn way(&self, from: u64, to: u64) -> Way {
        *self.0.lock().unwrap().get(&(from, to)).unwrap_or(&Way::Up)
    }

    /// Every direction up.
    pub fn heal(&self) {
        self.0.lock().unwrap().clear();
    }

    /// Serves the proxy of node `target` on `listener`, passing
    /// connections on to `upstream` (host:port of its replication
    /// listener).
    pub fn proxy(&self, target: u64, listener: std::net::TcpListener, upstream: String) {
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let wires = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(POLL).await;
                    continue;
                };
                let (wires, upstream) = (wires.clone(), upstream.clone());
                tokio::spawn(async move {
                    wires.connection(target, stream, &upstream).await;
                });
            }
        });
    }

    /// One connection to `target`: its sender from its first request's
    /// head, then bytes both ways while the directions let them.
    async fn connection(&self, target: u64, mut client: TcpStream, upstream: &str) {
        let _ = client.set_nodelay(true);
        let Some((from, head)) = sender(&mut client).await else {
            return;
        };
        if self.way(from, target) == Way::Reset || self.way(target, from) == Way::Reset {
            reset(client);
            return;
        }
        let Ok(server) = TcpStream::connect(upstream).await else {
            reset(client);
            return;
        };
        let _ = server.set_nodelay(true);
        let gone = Gone::default();
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let out = self.pump(
            head,
            client_read,
            server_write,
            (from, target),
            &gone,
            Side::Client,
        );
        let back = self.pump(
            Vec::new(),
            server_read,
            client_write,
            (target, from),
            &gone,
            Side::Server,
        );
        let (out, back) = tokio::join!(out, back);
        // Each pump gave back the read half of its source and the write
        // half of its destination.
        let (client_read, server_write) = out.halves;
        let (server_read, client_write) = back.halves;
        let client = client_read
            .reunite(client_write)
            .expect("one connection's halves");
        let server = server_read
            .reunite(server_write)
            .expect("one connection's halves");
        match gone.reset() {
            Some(Ended::Reset(Side::Client)) => {
                reset(client);
                silent(server);
            }
            Some(Ended::Reset(Side::Server)) => {
                reset(server);
                silent(client);
            }
            // One end failed: the network passes that on.
            Some(Ended::Broken) => {
                reset(client);
                reset(server);
            }
            // Both ends closed: the closes were passed on.
            None => {}
        }
    }

    /// Passes bytes `from` → `to` (with `first` before them) while the
    /// direction `way` allows: held while it is a blackhole. A reset of
    /// the direction resets `source` (the side whose bytes met it) and
    /// leaves the other side open, hearing nothing: a middlebox's RST
    /// reaches one end. Returns once its source ended (the end passed on)
    /// or either side was reset.
    async fn pump(
        &self,
        first: Vec<u8>,
        mut from: OwnedReadHalf,
        mut to: OwnedWriteHalf,
        way: (u64, u64),
        gone: &Gone,
        source: Side,
    ) -> Pumped {
        let mut pending = first;
        let mut buf = vec![0u8; 64 << 10];
        let done = |from, to| Pumped { halves: (from, to) };
        loop {
            if gone.reset().is_some() {
                return done(from, to);
            }
            match self.way(way.0, way.1) {
                Way::Reset => {
                    gone.set(Ended::Reset(source));
                    return done(from, to);
                }
                Way::Blackhole => {
                    tokio::time::sleep(POLL).await;
                    continue;
                }
                Way::Up => {}
            }
            if !pending.is_empty() {
                // Written in pieces, so that a destination that does not
                // read leaves the loop free to see the way change.
                match tokio::time::timeout(POLL, to.write(&pending)).await {
                    Err(_) => {}
                    Ok(Ok(n)) if n > 0 => drop(pending.drain(..n)),
                    Ok(_) => {
                        gone.set(Ended::Broken);
                        return done(from, to);
                    }
                }
                continue;
            }
            match tokio::time::timeout(POLL, from.read(&mut buf)).await {
                Err(_) => {}
                Ok(Ok(0)) => {
                    let _ = to.shutdown().await;
                    return done(from, to);
                }
                Ok(Ok(n)) => pending.extend_from_slice(&buf[..n]),
                Ok(Err(_)) => {
                    gone.set(Ended::Broken);
                    return done(from, to);
                }
            }
        }
    }
}

/// One end of a proxied connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Client,
    Server,
}

/// How a connection ended, when not by both ends closing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// A reset met the bytes of this end.
    Reset(Side),
    /// An end failed (its reset, or a write it refused).
    Broken,
}

/// How a connection ended, once it did (the first wins).
#[derive(Default)]
struct Gone(Mutex<Option<Ended>>);

impl Gone {
    fn set(&self, ended: Ended) {
        self.0.lock().unwrap().get_or_insert(ended);
    }

    fn reset(&self) -> Option<Ended> {
        *self.0.lock().unwrap()
    }
}

/// A pump's end: the read half of its source, the write half of its
/// destination.
struct Pumped {
    halves: (OwnedReadHalf, OwnedWriteHalf),
}

/// Closes `stream` with an RST.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// The end of a connection whose other end was reset where it cannot
/// hear: it stays open and is told nothing, until it sends a byte (the
/// host that forgot the connection answers it with an RST) or closes.
fn silent(mut stream: TcpStream) {
    tokio::spawn(async move {
        let mut byte = [0u8; 1];
        if let Ok(n) = stream.read(&mut byte).await
            && n > 0
        {
            reset(stream);
        }
    });
}

/// Reads `stream` until its first request's head is whole: the sender it
/// names and every byte read.
async fn sender(stream: &mut TcpStream) -> Option<(u64, Vec<u8>)> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 || head.len() > 64 << 10 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let from = text
        .lines()
        .find_map(|l| l.strip_prefix("spooler-cluster-from:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((from, head))
}
