//! The HTTP side of the operator commands: where the server is, the API
//! key, the one retry at the primary that a replica names, and every
//! failure as an [`OpsError`] that reads as one line.

use std::fmt::Write as _;

use reqwest::{Client, Method, Request, RequestBuilder, Response, StatusCode, Url};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Where the server is and how to authenticate.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    pub api_key: Option<String>,
}

/// A failure to show the operator.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The server answered with an error body.
    #[error("{kind}: {message}")]
    Server { kind: String, message: String },
    /// The server could not be reached, or answered something unreadable;
    /// `reason` carries the whole chain of causes.
    #[error("cannot talk to {url}: {reason}")]
    Transport { url: String, reason: String },
    /// A flag's value is wrong: exit 2.
    #[error("{0}")]
    Usage(String),
    /// The operator did not confirm.
    #[error("{0}")]
    Declined(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The body of a refusal (docs/contract.md): a stable `kind` and a message
/// for people. A proxy's error page has neither.
#[derive(Default, Deserialize)]
struct Refusal {
    kind: Option<String>,
    message: Option<String>,
}

impl Target {
    /// `url` may leave out the scheme (`127.0.0.1:8787`): HTTP is meant.
    pub fn new(url: &str, api_key: Option<String>) -> Target {
        let url = if url.contains("://") {
            url.to_owned()
        } else {
            format!("http://{url}")
        };
        Target { url, api_key }
    }

    fn client() -> Client {
        crate::tls::install_crypto_provider();
        Client::new()
    }

    /// A request to `path` of the API, with the API key when there is one.
    pub(super) fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let url = format!("{}{path}", self.url.trim_end_matches('/'));
        let b = Target::client().request(method, url);
        match &self.api_key {
            Some(key) => b.header("Spooler-Api-Key", key),
            None => b,
        }
    }

    /// Sends `request`; a success as it came, anything else as an error.
    pub(super) async fn send(&self, request: RequestBuilder) -> Result<Response, OpsError> {
        let (client, request) = request.build_split();
        let request = request.map_err(|e| self.transport(e))?;
        let again = request.try_clone();
        let mut response = client
            .execute(request)
            .await
            .map_err(|e| self.transport(e))?;
        if let Some(again) = to_primary(&response, again) {
            response = client.execute(again).await.map_err(|e| self.transport(e))?;
        }
        if response.status().is_success() {
            return Ok(response);
        }
        Err(refusal(response).await)
    }

    /// The answer to `request` read as `T` (`Value` to print it as it
    /// came).
    pub(super) async fn answer<T: DeserializeOwned>(
        &self,
        request: RequestBuilder,
    ) -> Result<T, OpsError> {
        let response = self.send(request).await?;
        response.json().await.map_err(|e| self.unreadable(&e))
    }

    /// The answer to `method path` read as `T`.
    pub(super) async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
    ) -> Result<T, OpsError> {
        self.answer(self.request(method, path)).await
    }

    /// An answer read as JSON (for `--json`) read again as `T`, for people.
    pub(super) fn decode<T: DeserializeOwned>(&self, answer: Value) -> Result<T, OpsError> {
        serde_json::from_value(answer).map_err(|e| self.unreadable(&e))
    }

    /// A stream (`tail`) that failed after it began.
    pub(super) fn broken_stream(&self, e: reqwest::Error) -> OpsError {
        OpsError::Transport {
            url: self.url.clone(),
            reason: format!("the stream broke off: {}", with_causes(&e.without_url())),
        }
    }

    fn transport(&self, e: reqwest::Error) -> OpsError {
        OpsError::Transport {
            url: self.url.clone(),
            reason: with_causes(&e.without_url()),
        }
    }

    fn unreadable(&self, e: &dyn std::error::Error) -> OpsError {
        OpsError::Transport {
            url: self.url.clone(),
            reason: format!("unreadable answer: {}", with_causes(e)),
        }
    }
}

/// A replica that does not relay answers `421` and names the primary
/// (`Spooler-Primary`): the same request again, addressed to the primary.
/// None when the answer is another, or the request cannot be sent twice.
fn to_primary(response: &Response, again: Option<Request>) -> Option<Request> {
    if response.status() != StatusCode::MISDIRECTED_REQUEST {
        return None;
    }
    let primary = response
        .headers()
        .get("spooler-primary")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| Url::parse(v).ok())?;
    let mut again = again?;
    let url = again.url_mut();
    let _ = url.set_scheme(primary.scheme());
    let _ = url.set_host(primary.host_str());
    let _ = url.set_port(primary.port());
    Some(again)
}

/// A refusal as an error: its kind and message, or the HTTP status when
/// the body says neither.
async fn refusal(response: Response) -> OpsError {
    let status = response.status();
    let body: Refusal = response.json().await.unwrap_or_default();
    OpsError::Server {
        kind: body.kind.unwrap_or_else(|| "error".to_owned()),
        message: body.message.unwrap_or_else(|| format!("HTTP {status}")),
    }
}

/// An error and its causes, `: `-separated (reqwest's own message is only
/// "error sending request"; the cause says "connection refused").
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            let _ = write!(text, ": {more}");
        }
        source = cause.source();
    }
    text
}

/// `pairs` as a query string.
pub(super) fn encode(pairs: &[(&str, String)]) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        q.append_pair(k, v);
    }
    q.finish()
}

/// `text` (a message id the operator typed) as one segment of a path.
pub(super) fn path_segment(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}
