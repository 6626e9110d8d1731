//! The replication links as TCP sees them: each replica's replication
//! listener is reached by the others through a TCP proxy of its own, which
//! tells the sender of a connection by the `spooler-cluster-from` header
//! of its first request and then passes bytes. Each direction of each
//! link is up, reset or a blackhole, on its own: the bytes a connection
//! opened by `a` carries to `b` travel `a → b`, its answers `b → a`.
//!
//! - A reset closes every connection that travels that direction with an
//!   RST, and resets the ones opened while it lasts.
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
            reset(&client);
            return;
        }
        let Ok(server) = TcpStream::connect(upstream).await else {
            reset(&client);
            return;
        };
        let _ = server.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let out = self.pump(head, client_read, server_write, (from, target));
        let back = self.pump(Vec::new(), server_read, client_write, (target, from));
        tokio::pin!(out, back);
        // Either direction reset ends both; an end of stream in one lets
        // the other go on (a half-close).
        let ended = tokio::select! {
            e = &mut out => (e, true),
            e = &mut back => (e, false),
        };
        let halves = match ended {
            (Pumped::Reset(a, b), _) => Some((a, b)),
            (Pumped::Ended, true) => match back.await {
                Pumped::Reset(a, b) => Some((a, b)),
                Pumped::Ended => None,
            },
            (Pumped::Ended, false) => match out.await {
                Pumped::Reset(a, b) => Some((a, b)),
                Pumped::Ended => None,
            },
        };
        if let Some((read, write)) = halves {
            reset(read.as_ref());
            reset(write.as_ref());
            // The other direction's halves go with the tasks' futures,
            // dropped here: with linger 0 on both sockets, an RST each.
        }
    }

    /// Passes bytes `from` → `to` (with `first` before them) while the
    /// direction `way` allows: held while it is a blackhole, reset when
    /// it is reset.
    async fn pump(
        &self,
        first: Vec<u8>,
        mut from: OwnedReadHalf,
        mut to: OwnedWriteHalf,
        way: (u64, u64),
    ) -> Pumped {
        let mut pending = first;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match self.way(way.0, way.1) {
                Way::Reset => return Pumped::Reset(from, to),
                Way::Blackhole => {
                    tokio::time::sleep(POLL).await;
                    continue;
                }
                Way::Up => {}
            }
            if !pending.is_empty() {
                if to.write_all(&pending).await.is_err() {
                    return Pumped::Reset(from, to);
                }
                pending.clear();
            }
            match tokio::time::timeout(POLL, from.read(&mut buf)).await {
                Err(_) => {}
                Ok(Ok(0)) => {
                    let _ = to.shutdown().await;
                    return Pumped::Ended;
                }
                Ok(Ok(n)) => pending.extend_from_slice(&buf[..n]),
                Ok(Err(_)) => return Pumped::Reset(from, to),
            }
        }
    }
}

/// How one direction of a connection ended.
enum Pumped {
    /// Its source closed; the close was passed on.
    Ended,
    /// Reset: the halves, to close with an RST.
    Reset(OwnedReadHalf, OwnedWriteHalf),
}

/// Closes with an RST when dropped.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
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
