//! Name resolution for push delivery, through the destination guard
//! (`engine/guard.rs`): a name is resolved when a delivery connects, and
//! every address it gives is checked there, so that a name that resolves
//! (or is rebound) to a link-local or metadata address, or outside the
//! ranges `server.allowed_destinations` lists, is never dialled. Both ways
//! of delivery use it: reqwest's client (`client.rs`) and the direct
//! connections (`direct.rs`).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tower_service::Service;

use crate::engine::guard::Guard;

/// A resolver that keeps only the addresses the guard allows.
#[derive(Clone)]
pub(crate) struct GuardedResolver {
    guard: Guard,
}

impl GuardedResolver {
    pub(crate) fn new(guard: Guard) -> GuardedResolver {
        GuardedResolver { guard }
    }
}

/// The addresses of `host` the guard allows (port 0: the caller sets it);
/// an error naming why when there is none.
async fn resolve(guard: Guard, host: String) -> io::Result<Vec<SocketAddr>> {
    let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
    let mut refused = None;
    let kept: Vec<SocketAddr> = found
        .into_iter()
        .filter(|addr| match guard.check_resolved(&host, addr.ip()) {
            Ok(()) => true,
            Err(why) => {
                refused = Some(why);
                false
            }
        })
        .collect();
    if kept.is_empty() {
        return Err(io::Error::other(match refused {
            Some(why) => {
                format!("{host} resolves only to addresses deliveries may not reach: {why}")
            }
            None => format!("{host} resolves to no address"),
        }));
    }
    Ok(kept)
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let lookup = resolve(self.guard.clone(), name.as_str().to_owned());
        Box::pin(async move {
            let addrs = lookup.await?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

type Lookup = Pin<Box<dyn Future<Output = io::Result<std::vec::IntoIter<SocketAddr>>> + Send>>;

impl Service<hyper_util::client::legacy::connect::dns::Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = io::Error;
    type Future = Lookup;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: hyper_util::client::legacy::connect::dns::Name) -> Lookup {
        let lookup = resolve(self.guard.clone(), name.as_str().to_owned());
        Box::pin(async move { Ok(lookup.await?.into_iter()) })
    }
}
