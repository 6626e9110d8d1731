//! An HTTP client for one spoold (in this process or a child): its base
//! URL and API key, and the requests tests make again and again.

use reqwest::{Client, Method, RequestBuilder, Response, StatusCode};
use serde_json::Value;

#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub client: Client,
    pub key: Option<String>,
}

impl Api {
    pub fn new(base: String, key: Option<String>) -> Api {
        spoold::testing::install_crypto_provider();
        Api {
            base,
            client: Client::new(),
            key,
        }
    }

    /// `host:port`.
    pub fn addr(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    /// A request to `path`, with the API key if there is one.
    pub fn req(&self, method: Method, path: &str) -> RequestBuilder {
        let b = self.client.request(method, format!("{}{path}", self.base));
        match &self.key {
            Some(k) => b.header("Spooler-Api-Key", k),
            None => b,
        }
    }

    pub fn get(&self, path: &str) -> RequestBuilder {
        self.req(Method::GET, path)
    }

    /// Sends a request without a body and returns the answer.
    pub async fn call(&self, method: Method, path: &str) -> Response {
        self.req(method, path).send().await.unwrap()
    }

    /// Like [`Api::call`], without the API key.
    pub async fn bare(&self, method: Method, path: &str) -> Response {
        let url = format!("{}{path}", self.base);
        self.client.request(method, url).send().await.unwrap()
    }

    pub async fn status(&self, method: Method, path: &str) -> StatusCode {
        self.call(method, path).await.status()
    }

    pub async fn text(&self, path: &str) -> String {
        self.call(Method::GET, path).await.text().await.unwrap()
    }

    /// The ids of `queue`'s messages (up to 1 000, oldest first) that the
    /// peek query `query` (`&status=500`…) selects.
    pub async fn message_ids(&self, queue: &str, query: &str) -> Vec<String> {
        let page = self
            .get_json(&format!("/v1/queues/{queue}/messages?limit=1000{query}"))
            .await;
        page["messages"]
            .as_array()
            .unwrap_or_else(|| panic!("{page}"))
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    }

    pub async fn get_json(&self, path: &str) -> Value {
        self.call(Method::GET, path).await.json().await.unwrap()
    }

    /// A `POST` without a body; its answer as JSON.
    pub async fn post_json(&self, path: &str) -> Value {
        self.call(Method::POST, path).await.json().await.unwrap()
    }

    pub async fn put_queue(&self, q: &str, settings: Value) -> Response {
        self.req(Method::PUT, &format!("/v1/queues/{q}"))
            .json(&settings)
            .send()
            .await
            .unwrap()
    }

    /// Creates or changes a queue, which must succeed.
    pub async fn queue(&self, q: &str, settings: Value) {
        let r = self.put_queue(q, settings).await;
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    }

    pub async fn send(&self, q: &str, body: &str) -> Response {
        self.req(Method::POST, &format!("/v1/queues/{q}/messages"))
            .header("Content-Type", "text/plain")
            .body(body.to_string())
            .send()
            .await
            .unwrap()
    }

    /// Sends and returns the new message's id (the send must succeed).
    pub async fn send_id(&self, q: &str, body: &str) -> String {
        let r = self.send(q, body).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        let v: Value = r.json().await.unwrap();
        v["id"].as_str().unwrap().to_string()
    }

    pub async fn receive(&self, q: &str, query: &str) -> Response {
        self.call(Method::POST, &format!("/v1/queues/{q}/receive{query}"))
            .await
    }

    /// Receives one message, which must be there: its lease token.
    pub async fn lease(&self, q: &str) -> String {
        let r = self.receive(q, "").await;
        assert_eq!(r.status(), StatusCode::OK, "nothing to receive in {q}");
        r.headers()["spooler-lease-token"]
            .to_str()
            .unwrap()
            .to_string()
    }

    /// `ack`, `nack` (with its query) or `renew` of a lease.
    pub async fn settle(&self, q: &str, token: &str, verb: &str) -> Response {
        self.call(
            Method::POST,
            &format!("/v1/queues/{q}/leases/{token}/{verb}"),
        )
        .await
    }

    pub async fn forward(&self, q: &str, path: &str, body: &str) -> Response {
        self.req(Method::POST, &format!("/v1/forward/{q}/{path}"))
            .body(body.to_string())
            .send()
            .await
            .unwrap()
    }
}
