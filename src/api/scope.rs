//! What a request may do (docs/contract.md §4, "Keys and scopes"): the
//! [`Grant`] its key carries, and [`need`], the one table of what each
//! route asks of it. The gate (`mod.rs`) checks every request against it
//! before the handler runs; the lists and the publish answer, which span
//! queues, keep to the grant themselves ([`Grant::reaches`]).
//!
//! A queue outside a key's scope is answered as a queue that does not
//! exist, so that a key cannot learn another tenant's queue names; a route
//! whose verb the key lacks is `403` whatever the queue.

use std::sync::{Arc, OnceLock};

use axum::http::Method;

use super::error::ApiError;
use crate::config::{ApiKey, Role, pattern_matches};
use crate::engine::{Engine, QueueError, QueueOwner};
use crate::spool::queue::origin_queue_name;

/// A kind of call (docs/contract.md §4): each route needs one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    /// Every `GET`: queues, messages, history, deliveries, rates, tails.
    Read,
    /// Send, forward and publish.
    Publish,
    /// Receive, ack, nack and renew.
    Consume,
    /// Create, change and delete queues, and act on their messages.
    Manage,
}

impl Verb {
    const ALL: [Verb; 4] = [Verb::Read, Verb::Publish, Verb::Consume, Verb::Manage];

    fn bit(self) -> u8 {
        1 << self as u8
    }

    fn as_str(self) -> &'static str {
        match self {
            Verb::Read => "read",
            Verb::Publish => "publish",
            Verb::Consume => "consume",
            Verb::Manage => "manage",
        }
    }
}

/// What one key (or portal session) may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    /// A bit per [`Verb`].
    verbs: u8,
    /// Set: only the push queues of this tenant, and its events.
    tenant: Option<String>,
    /// Queue-name globs; empty: every name.
    queues: Vec<String>,
}

impl Grant {
    /// Everything: a bare key, or any request when no key is configured.
    pub(crate) fn operator() -> Grant {
        Grant::of(&Verb::ALL, None, Vec::new())
    }

    /// [`Grant::operator`], one shared by every request that carries it
    /// (every request of a server without keys): not allocated per request.
    pub(crate) fn shared_operator() -> Arc<Grant> {
        static OPERATOR: OnceLock<Arc<Grant>> = OnceLock::new();
        OPERATOR.get_or_init(|| Arc::new(Grant::operator())).clone()
    }

    pub(crate) fn of(verbs: &[Verb], tenant: Option<String>, queues: Vec<String>) -> Grant {
        Grant {
            verbs: verbs.iter().fold(0, |bits, v| bits | v.bit()),
            tenant,
            queues,
        }
    }

    pub(crate) fn of_key(key: &ApiKey) -> Grant {
        let verbs: &[Verb] = match key.role {
            Role::Admin => &Verb::ALL,
            Role::Publisher => &[Verb::Publish],
            Role::Consumer => &[Verb::Consume],
            Role::Reader => &[Verb::Read],
        };
        Grant::of(verbs, key.tenant.clone(), key.queues.clone())
    }

    /// Every verb, on every queue: the cluster, `/metrics`, the rates of
    /// all queues and the event catalogue's writes need this.
    pub(crate) fn is_operator(&self) -> bool {
        self.tenant.is_none() && self.queues.is_empty() && self.verbs == Grant::operator().verbs
    }

    pub(crate) fn queues(&self) -> &[String] {
        &self.queues
    }

    pub(crate) fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    pub(crate) fn may(&self, verb: Verb) -> bool {
        self.verbs & verb.bit() != 0
    }

    /// The verbs it holds, by name.
    pub(crate) fn verbs(&self) -> Vec<&'static str> {
        Verb::ALL
            .into_iter()
            .filter(|v| self.may(*v))
            .map(Verb::as_str)
            .collect()
    }

    /// Whether queue `name`, belonging to `owner` (`None`: there is no
    /// such queue), is in scope. A tenant's key reaches only its tenant's
    /// push queues that the config does not manage; a queue that does not
    /// exist is in scope when its name is, so that its handler answers
    /// (or a `PUT` makes it).
    pub(crate) fn reaches(&self, name: &str, owner: Option<&QueueOwner>) -> bool {
        let base = origin_queue_name(name);
        if !self.queues.is_empty() && !self.queues.iter().any(|p| pattern_matches(p, base)) {
            return false;
        }
        match (&self.tenant, owner) {
            (None, _) | (Some(_), None) => true,
            (Some(tenant), Some(owner)) => {
                owner.push && !owner.managed_by_config && owner.tenant.as_ref() == Some(tenant)
            }
        }
    }

    /// Whether everything `other` allows, this allows too: a stream opened
    /// under `other` may go on under this.
    pub(crate) fn covers(&self, other: &Grant) -> bool {
        let verbs = self.verbs & other.verbs == other.verbs;
        let tenant = self.tenant.is_none() || self.tenant == other.tenant;
        let queues = self.queues.is_empty()
            || (!other.queues.is_empty() && other.queues.iter().all(|q| self.queues.contains(q)));
        verbs && tenant && queues
    }
}

/// What a route needs of a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// Outside `/v1` (probes, the console's page): nothing.
    Nothing,
    /// Any key at all (the OpenAPI document, the event catalogue).
    AnyKey,
    /// An operator's grant ([`Grant::is_operator`]).
    Operator,
    /// A verb; the handler keeps to the grant (the lists, publish).
    Verb(Verb),
    /// A verb on the queue the path names.
    Queue(Verb),
}

/// What `method` on `route` (its template) needs: the one table.
pub(crate) fn need(method: &Method, route: &str) -> Need {
    use Verb::{Consume, Manage, Publish, Read};
    let read = method == Method::GET;
    if route == "/metrics"
        || route.starts_with("/v1/cluster")
        || route == "/v1/rates"
        || route == "/v1/portal/sessions"
    {
        return Need::Operator;
    }
    if route == "/v1/openapi.json" || (route.starts_with("/v1/event-types") && read) {
        return Need::AnyKey;
    }
    if route.starts_with("/v1/event-types") {
        return Need::Operator;
    }
    if route == "/v1/queues" {
        return Need::Verb(Read);
    }
    if route == "/v1/events" {
        return Need::Verb(Publish);
    }
    if route.starts_with("/v1/forward/") {
        return Need::Queue(Publish);
    }
    if !route.starts_with("/v1/queues/{q}") {
        return if route.starts_with("/v1") || route == "unmatched" {
            Need::AnyKey
        } else {
            Need::Nothing
        };
    }
    let tail = &route["/v1/queues/{q}".len()..];
    let verb = match (method.as_str(), tail) {
        ("GET", _) => Read,
        ("POST", "/messages") => Publish,
        ("POST", "/receive" | "/receive-batch") => Consume,
        ("POST", t) if t.starts_with("/leases/") => Consume,
        _ => Manage,
    };
    Need::Queue(verb)
}

/// Whether `grant` may make this call: `403` for a verb it lacks or a
/// route only an operator may call, and the not-found answer for a queue
/// outside its scope. `queue` is the queue the path names; `engine`,
/// when the spool is open, says who owns it.
pub(crate) fn authorize(
    grant: &Grant,
    need: Need,
    queue: Option<&str>,
    engine: Option<&Engine>,
) -> Result<(), ApiError> {
    if grant.is_operator() {
        return Ok(());
    }
    match need {
        Need::Nothing | Need::AnyKey => Ok(()),
        Need::Operator => Err(ApiError::forbidden(
            "this route needs an admin key without a tenant or queue patterns",
        )),
        Need::Verb(verb) => require(grant, verb),
        Need::Queue(verb) => {
            require(grant, verb)?;
            let Some(queue) = queue else { return Ok(()) };
            let owner = engine.and_then(|e| e.queue_owner(queue));
            if grant.reaches(queue, owner.as_ref()) {
                Ok(())
            } else {
                Err(out_of_scope(queue))
            }
        }
    }
}

fn require(grant: &Grant, verb: Verb) -> Result<(), ApiError> {
    if grant.may(verb) {
        return Ok(());
    }
    Err(ApiError::forbidden(format!(
        "this key may {} only; this route needs {}",
        grant.verbs().join(", "),
        verb.as_str()
    )))
}

/// The answer for a queue outside a key's scope: the very answer for one
/// that does not exist.
pub(crate) fn out_of_scope(queue: &str) -> ApiError {
    QueueError::NotFound {
        queue: queue.to_owned(),
    }
    .into()
}

/// Each operation's security requirements name what its key needs, from
/// the one table the server checks ([`need`]): `read`, `publish`,
/// `consume`, `manage`, `operator`, or nothing beyond a key.
/// Applied to the whole document, once the router's paths are in it.
pub(crate) fn document(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::security::{
        HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
    };
    let components = openapi.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
            "portalSession",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("spt")
                    .description(Some(
                        "A portal session's token (`POST /v1/portal/sessions`): a tenant's scope with the capabilities it was given (read, manage, publish), until it ends.",
                    ))
                    .build(),
            ),
        );
    for (path, item) in openapi.paths.paths.iter_mut() {
        for (method, op) in [
            (Method::GET, &mut item.get),
            (Method::POST, &mut item.post),
            (Method::PUT, &mut item.put),
            (Method::PATCH, &mut item.patch),
            (Method::DELETE, &mut item.delete),
        ] {
            let Some(op) = op else { continue };
            // A route open without a key says so itself.
            if op
                .security
                .as_ref()
                .is_some_and(|s| s.iter().all(|r| r == &SecurityRequirement::default()))
            {
                continue;
            }
            let scopes: Vec<&str> = match need(&method, path) {
                Need::Nothing | Need::AnyKey => Vec::new(),
                Need::Operator => vec!["operator"],
                Need::Verb(v) | Need::Queue(v) => vec![match v {
                    Verb::Read => "read",
                    Verb::Publish => "publish",
                    Verb::Consume => "consume",
                    Verb::Manage => "manage",
                }],
            };
            let mut schemes = vec![SecurityRequirement::new("apiKey", scopes.clone())];
            // On /v1/forward, `Authorization` is the destination's: only
            // Spooler-Api-Key counts there.
            let bearer_counts = !path.starts_with("/v1/forward/");
            if bearer_counts {
                schemes.push(SecurityRequirement::new("bearer", scopes.clone()));
                let portal = matches!(scopes.as_slice(), [] | ["read" | "manage" | "publish"]);
                if portal {
                    schemes.push(SecurityRequirement::new("portalSession", scopes));
                }
            }
            // Without any key configured the server asks for none: a
            // generated client may then call without a token.
            schemes.push(SecurityRequirement::default());
            op.security = Some(schemes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(tenant: Option<&str>, push: bool) -> QueueOwner {
        QueueOwner {
            push,
            tenant: tenant.map(str::to_owned),
            managed_by_config: false,
        }
    }

    #[test]
    fn a_tenant_reaches_only_its_push_queues() {
        let grant = Grant::of(&[Verb::Read], Some("a".into()), vec!["a-*".into()]);
        assert!(grant.reaches("a-1", Some(&owner(Some("a"), true))));
        assert!(grant.reaches("a-1.failed", Some(&owner(Some("a"), true))));
        assert!(grant.reaches("a-new", None));
        assert!(!grant.reaches("a-1", Some(&owner(Some("b"), true))));
        assert!(!grant.reaches("a-1", Some(&owner(None, true))));
        assert!(!grant.reaches("a-1", Some(&owner(Some("a"), false))));
        assert!(!grant.reaches("b-1", None));
        let managed = QueueOwner {
            managed_by_config: true,
            ..owner(Some("a"), true)
        };
        assert!(!grant.reaches("a-1", Some(&managed)));
    }

    #[test]
    fn routes_need_their_verb() {
        let post = Method::POST;
        assert_eq!(
            need(&post, "/v1/queues/{q}/receive"),
            Need::Queue(Verb::Consume)
        );
        assert_eq!(
            need(&post, "/v1/queues/{q}/leases/{token}/ack"),
            Need::Queue(Verb::Consume)
        );
        assert_eq!(
            need(&post, "/v1/queues/{q}/messages"),
            Need::Queue(Verb::Publish)
        );
        assert_eq!(
            need(&Method::DELETE, "/v1/queues/{q}/messages"),
            Need::Queue(Verb::Manage)
        );
        assert_eq!(
            need(&Method::GET, "/v1/queues/{q}/tail"),
            Need::Queue(Verb::Read)
        );
        assert_eq!(need(&Method::GET, "/v1/rates"), Need::Operator);
        assert_eq!(need(&post, "/v1/cluster/members"), Need::Operator);
        assert_eq!(need(&Method::GET, "/healthz"), Need::Nothing);
        assert_eq!(need(&Method::GET, "/v1/nope"), Need::AnyKey);
    }

    #[test]
    fn narrowing_is_seen() {
        let wide = Grant::of(&[Verb::Read, Verb::Publish], Some("a".into()), vec![]);
        let narrow = Grant::of(&[Verb::Read], Some("a".into()), vec!["a-*".into()]);
        assert!(wide.covers(&narrow));
        assert!(!narrow.covers(&wide));
        assert!(Grant::operator().covers(&wide));
        assert!(!wide.covers(&Grant::operator()));
        assert!(wide.covers(&wide.clone()));
    }
}
