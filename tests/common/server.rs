//! The server in this test's process (the library's `serve::start`) on
//! 127.0.0.1:0, with an HTTP client that carries its API key. Tests that
//! must kill or signal the binary use [`super::process`] instead.

use std::path::Path;
use std::time::Duration;

use reqwest::StatusCode;
use spoold::config::Config;

use super::api::Api;
use spoold::serve::Running;

pub struct Server {
    running: Option<Running>,
    api: Api,
    /// The spool's directory when the server made it ([`Server::temp`]).
    _dir: Option<tempfile::TempDir>,
}

impl std::ops::Deref for Server {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Server {
    /// Starts with its spool in `dir`; `toml` follows the `listen` line
    /// (more `[server]` keys, then tables). Segments are 1 MiB unless
    /// `toml` says otherwise. Returns once `/readyz` answers 200.
    pub async fn start(dir: &Path, toml: &str) -> Server {
        let text = format!("[server]\nlisten = \"127.0.0.1:0\"\n{toml}\n");
        let mut config = Config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        config.spool.dir = dir.to_path_buf();
        if config.spool.segment_bytes == 64 << 20 {
            config.spool.segment_bytes = 1 << 20;
        }
        let key = match config.server.api_keys.first() {
            Some(spoold::config::ApiKeyEntry::Plain(key)) => Some(key.clone()),
            Some(spoold::config::ApiKeyEntry::Scoped(scoped)) => scoped.key.clone(),
            None => None,
        };
        let running = spoold::serve::start(config, None)
            .await
            .expect("server starts");
        let server = Server {
            api: Api::new(format!("http://{}", running.addr), key),
            running: Some(running),
            _dir: None,
        };
        super::eventually(
            "the server to be ready",
            Duration::from_secs(30),
            async || {
                let r = server.get("/readyz").send().await;
                r.is_ok_and(|r| r.status() == StatusCode::OK).then_some(())
            },
        )
        .await;
        server
    }

    /// Like [`Server::start`], in a temporary directory of its own.
    pub async fn temp(toml: &str) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let mut server = Server::start(dir.path(), toml).await;
        server._dir = Some(dir);
        server
    }

    pub fn api(&self) -> &Api {
        &self.api
    }

    pub fn running(&self) -> &Running {
        self.running.as_ref().expect("running")
    }

    /// Stops gracefully and waits for the end.
    pub async fn stop(mut self) {
        let running = self.running.take().unwrap();
        running.stop();
        running.wait().await.unwrap();
    }
}
