//! `spoold check-config` refuses every config `spoold run` refuses, and
//! says why with the key as the file spells it and its line: a table of
//! bad configs, each given to both commands.

use crate::common;

/// (what is wrong, the config's tables, what the error must name).
const BAD: &[(&str, &str, &[&str])] = &[
    (
        "an ftp destination",
        "[queues.q]\ndestination = \"ftp://a/b\"\n",
        &["queues.q.destination", "line 5"],
    ),
    (
        "a destination with a query",
        "[queues.q]\ndestination = \"http://a.example.com/b?x=1\"\n",
        &["queues.q.destination", "line 5"],
    ),
    (
        "no concurrency",
        "[queues.q]\ndestination = \"http://a.example.com/\"\nconcurrency = 0\n",
        &["queues.q.concurrency", "line 6", "1 to 1024"],
    ),
    (
        "a rate that is no period",
        "[queues.q]\ndestination = \"http://a.example.com/\"\nrate_limit = 1e-300\n",
        &["queues.q.rate_limit", "line 6"],
    ),
    (
        "a trace collector that is no URL",
        "[telemetry]\notlp_endpoint = \"otel-collector:4318\"\n",
        &["telemetry.otlp_endpoint", "line 5", "http"],
    ),
    (
        "a lease of nothing",
        "[queues.q]\nlease_timeout = \"0s\"\n",
        &["queues.q.lease_timeout", "line 5"],
    ),
    (
        "a static Host header",
        "[queues.q]\ndestination = \"http://a.example.com/\"\nheaders = { Host = \"x\" }\n",
        &["queues.q.headers", "line 6"],
    ),
    (
        "a backoff that shrinks",
        "[queues.q]\ndestination = \"http://a.example.com/\"\nbackoff = { multiplier = 0.5 }\n",
        &["queues.q.backoff.multiplier", "line 6"],
    ),
    (
        "a whsec_ secret that is not base64",
        "[queues.q]\ndestination = \"http://a.example.com/\"\nsigning_secret = \"whsec_!!!\"\n",
        &["queues.q.signing_secret", "line 6"],
    ),
    (
        "a plain signing secret (Standard Webhooks libraries would reject its signatures)",
        "[queues.q]\ndestination = \"http://a.example.com/\"\nsigning_secret = \"my-plain-secret\"\n",
        &["queues.q.signing_secret", "line 6", "whsec_"],
    ),
    (
        "a cluster without a secret",
        "[cluster]\nnode_id = 1\nlisten = \"127.0.0.1:0\"\napi_url = \"http://127.0.0.1:1\"\n\
         peers = { 1 = \"127.0.0.1:1\" }\n",
        &["cluster.secret"],
    ),
    (
        "a cluster secret of sixteen spaces",
        "[cluster]\nnode_id = 1\nlisten = \"127.0.0.1:0\"\napi_url = \"http://127.0.0.1:1\"\n\
         peers = { 1 = \"127.0.0.1:1\" }\nsecret = \"                \"\n",
        &["cluster.secret", "line 9", "whitespace"],
    ),
    (
        "a CA file that is not there",
        "[queues.q]\ndestination = \"https://a.example.com/\"\nca_file = \"/nonexistent/ca.pem\"\n",
        &["queues.q.ca_file", "line 6"],
    ),
    (
        "a client certificate without its key",
        "[queues.q]\ndestination = \"https://a.example.com/\"\nclient_cert = \"/etc/hostname\"\n",
        &["queues.q.client_cert", "line 6"],
    ),
    (
        "a queue name with a dot",
        "[queues.\"a.b\"]\n",
        &["queues.a.b", "invalid queue name"],
    ),
    (
        "a cluster certificate that is not there",
        "[cluster]\nnode_id = 1\nlisten = \"127.0.0.1:0\"\napi_url = \"http://127.0.0.1:1\"\n\
         peers = { 1 = \"127.0.0.1:1\" }\nsecret = \"0123456789abcdef0123\"\n\
         tls = { cert = \"/nonexistent/c.pem\", key = \"/nonexistent/k.pem\", ca = \"/nonexistent/ca.pem\" }\n",
        &["cluster.tls.cert", "line 10"],
    ),
];

/// Bad `[server]` or `[spool]` keys: (what, the whole file's text after
/// `[spool] dir`, what the error must name).
const BAD_SERVER: &[(&str, &str, &[&str])] = &[
    (
        "beyond loopback without a key",
        "[server]\nlisten = \"0.0.0.0:0\"\n",
        &["server.listen", "line 4", "API key"],
    ),
    (
        "an empty API key",
        "[server]\napi_keys = [\"\"]\n",
        &["server.api_keys", "line 4", "empty"],
    ),
    (
        "an API key of sixteen spaces",
        "[server]\napi_keys = [\"                \"]\n",
        &["server.api_keys", "line 4", "whitespace"],
    ),
    (
        "a shutdown grace of ages (it became u64::MAX ms)",
        "[server]\nshutdown_grace = \"99999999999999999999d\"\n",
        &["server.shutdown_grace", "line 4", "too long"],
    ),
    (
        "a shutdown grace past an hour",
        "[server]\nshutdown_grace = \"2h\"\n",
        &["server.shutdown_grace", "line 4", "out of range"],
    ),
    (
        "a destination the server does not allow",
        "[server]\nallowed_destinations = [\"*.example.com\"]\n[queues.q]\ndestination = \"http://127.0.0.1/\"\n",
        &["queues.q", "line 6", "allowed_destinations"],
    ),
    (
        "a max_bytes below four segments",
        "[spool]\nsegment_bytes = \"64KiB\"\nmax_bytes = \"128KiB\"\n",
        &["max_bytes", "line 5"],
    ),
    (
        // Issue 38, finding 1: a 270 MiB body was acknowledged, then lost
        // or refused at the next start, as a record past the journal's
        // bound reads as damage.
        "a body bound past the journal's record bound",
        "[server]\nmax_body_bytes = \"300MiB\"\n",
        &["server.max_body_bytes", "line 4", "240MiB"],
    ),
    (
        "a max_bytes with more files than descriptors to read them",
        "[spool]\nsegment_bytes = \"64KiB\"\nmax_bytes = \"2GiB\"\n",
        &["spool.max_bytes", "line 5", "16384"],
    ),
    (
        "a plain-HTTP client that is neither way",
        "[delivery]\nplain_http_client = \"hyper\"\n",
        &["delivery.plain_http_client", "line 4", "direct", "pooled"],
    ),
    (
        "no connections per host",
        "[delivery]\nmax_connections_per_host = 0\n",
        &["delivery.max_connections_per_host", "line 4", "1 to 65535"],
    ),
];

fn write(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// `check-config`: its exit code and everything it printed.
fn check_config(config: &std::path::Path) -> (i32, String) {
    let name = config.file_name().unwrap().to_str().unwrap();
    let ran = common::process::run_in(
        config.parent().unwrap(),
        &["check-config", "--config", name],
    );
    (ran.code, format!("{}{}", ran.stdout, ran.stderr))
}

/// `run`: Some(exit code, stderr) if it stops within 10 s, None if it
/// serves (then it is killed).
fn run(config: &std::path::Path) -> Option<(i32, String)> {
    common::process::run_refuses(config).map(|ran| (ran.code, ran.stderr))
}

#[test]
fn check_config_refuses_what_run_refuses_naming_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let head = format!("# a config\n[spool]\ndir = \"{}\"\n", spool.display());
    let mut cases: Vec<(String, String, &[&str])> = Vec::new();
    for (what, tables, needles) in BAD {
        cases.push((what.to_string(), format!("{head}{tables}"), needles));
    }
    for (what, text, needles) in BAD_SERVER {
        // These replace the `[spool]` table's position: the key's line is
        // counted in the file as written.
        let text = if text.starts_with("[spool]") {
            format!(
                "# a config\n\n{}\ndir = \"{}\"\n",
                text.trim_end(),
                spool.display()
            )
        } else {
            format!("# a config\n\n{text}")
        };
        cases.push((what.to_string(), text, needles));
    }
    for (i, (what, text, needles)) in cases.iter().enumerate() {
        let config = write(dir.path(), &format!("bad{i}.toml"), text);
        let (code, said) = check_config(&config);
        assert_ne!(code, 0, "check-config accepted {what}:\n{text}");
        for needle in needles.iter() {
            assert!(said.contains(needle), "{what}: {needle:?} not in {said}");
        }
        let (code, stderr) = run(&config).unwrap_or_else(|| panic!("run served {what}"));
        assert_ne!(code, 0, "{what}");
        for needle in needles.iter() {
            assert!(
                stderr.contains(needle),
                "run, {what}: {needle:?} not in {stderr}"
            );
        }
    }
    // And a good one: both accept it.
    let good = write(
        dir.path(),
        "good.toml",
        &format!(
            "{head}[server]\nlisten = \"127.0.0.1:0\"\n[queues.q]\ndestination = \"http://a.example.com/\"\nheaders = {{ Authorization = \"Bearer x\" }}\n"
        ),
    );
    let (code, said) = check_config(&good);
    assert_eq!(code, 0, "{said}");
    assert!(!said.contains("Bearer x"), "a header value printed: {said}");
    assert!(run(&good).is_none(), "run refused a good config");
}
