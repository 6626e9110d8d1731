//! The config as a whole: defaults, queue tables, and errors that name the
//! key and the line (the `[cluster]` table's own are in `cluster.rs`).

use std::path::PathBuf;

use super::Config;
use crate::spool::queue::{Backoff, OnExpire, QueueSettings};

#[test]
fn empty_text_gives_the_embedded_defaults() {
    let c = Config::parse("").unwrap();
    assert_eq!(c, Config::default());
    assert_eq!(c.server.listen, "127.0.0.1:8787");
    assert_eq!(c.spool.dir, PathBuf::from("./spool"));
}

#[test]
fn queue_tables_become_settings() {
    let c = Config::parse(
        "[queues.orders]\nlease_timeout = \"60s\"\nmax_retries = 5\ndedup_window = \"10m\"\non_expire = \"fail\"\n\
         [queues.billing]\ndestination = \"https://b.example.com/h\"\nbackoff = { initial = \"1s\", multiplier = 2 }\n",
    )
    .unwrap();
    let orders = c.queues["orders"].settings();
    assert_eq!(orders.lease_timeout_ms, 60_000);
    assert_eq!(orders.max_retries, 5);
    assert_eq!(orders.dedup_window_ms, 600_000);
    assert_eq!(orders.on_expire, OnExpire::Fail);
    let billing = c.queues["billing"].settings();
    assert_eq!(billing.backoff.initial_ms, 1_000);
    assert_eq!(billing.backoff.multiplier, 2.0);
    assert_eq!(billing.backoff.max_ms, Backoff::default().max_ms);
}

#[test]
fn errors_name_the_key_and_line() {
    let err = Config::parse("[spool]\ndir = \"x\"\nfsynk = true\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 3"), "{err}");
    assert!(err.contains("fsynk"), "{err}");
    let err = Config::parse("[server]\nshutdown_grace = \"soon\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 2"), "{err}");
    let err = Config::parse("[server]\nshutdown_grace = \"99999999999999999999d\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 2: server.shutdown_grace") && err.contains("too long"),
        "{err}"
    );
    let err = Config::parse("[server]\nshutdown_grace = \"2h\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 2: server.shutdown_grace"), "{err}");
    let err = Config::parse("[server]\napi_keys = [\"                \"]\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 2: server.api_keys"), "{err}");
    let err = Config::parse("[spool]\nsegment_bytes = \"64MiB\"\nmax_bytes = \"128MiB\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_bytes") && err.contains("line 3"), "{err}");
    let err = Config::parse("[spool]\nsegment_bytes = \"1KiB\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("segment_bytes") && err.contains("line 2"),
        "{err}"
    );
}

#[test]
fn a_key_named_elsewhere_does_not_move_its_line() {
    // A comment that mentions the key, and a queue key that ends like it.
    let text = "# segment_bytes and max_bytes are small here\n[queues.a]\nhistory_max_bytes = \"1MiB\"\n\
                [spool]\nsegment_bytes = \"64KiB\"\nmax_bytes = \"128KiB\"\n";
    let err = Config::parse(text).unwrap_err().to_string();
    assert!(err.starts_with("line 6: spool.max_bytes"), "{err}");
}

#[test]
fn malformed_toml_names_the_key_of_its_line() {
    let err = Config::parse("[server]\nlisten = 127.0.0.1:80\n")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("line 2: server.listen: "), "{err}");
}

#[test]
fn a_queue_setting_in_a_table_of_its_own_is_named_on_its_line() {
    let text = "[queues.q]\ndestination = \"http://a.example.com/\"\n\
                [queues.q.backoff]\nmultiplier = 0.5\n";
    let err = Config::parse(text).unwrap_err().to_string();
    assert!(
        err.starts_with("line 4: queues.q.backoff.multiplier"),
        "{err}"
    );
}

#[test]
fn event_limits_name_their_line_not_a_queue_key_of_the_same_name() {
    let text = "[queues.a]\ndedup_window = \"1h\"\n[events]\nmax_subscribers = 10\ndedup_window = \"31d\"\n";
    let err = Config::parse(text).unwrap_err().to_string();
    assert!(err.starts_with("line 5: events.dedup_window"), "{err}");
    let text = "[queues.a]\n[events]\nmax_subscribers = 0\n";
    let err = Config::parse(text).unwrap_err().to_string();
    assert!(err.starts_with("line 3: events.max_subscribers"), "{err}");
}

#[test]
fn the_effective_config_parses_back_to_the_same_config() {
    let text = include_str!("../../config.example.toml");
    let config = Config::parse(text).unwrap().redacted();
    let printed = config.effective_toml();
    let back = Config::parse(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
    assert_eq!(back.server, config.server);
    assert_eq!(back.spool, config.spool);
    assert_eq!(back.log, config.log);
    for (name, q) in &config.queues {
        let hidden = QueueSettings {
            signing_secret: None,
            ..q.settings()
        };
        assert_eq!(back.queues[name].settings(), hidden, "{name}");
    }
    assert!(printed.contains("# signing_secret is set"), "{printed}");
    assert!(!printed.contains("whsec_"), "{printed}");
}

#[test]
fn config_example_toml_parses() {
    let text = include_str!("../../config.example.toml");
    let config = Config::parse(text).expect("config.example.toml is valid");
    assert_eq!(config.queues.len(), 2);
    assert!(config.queues["billing"].settings().is_push());
}

#[test]
fn the_events_history_default_fills_event_endpoints_that_set_none() {
    let text = "[events]\nhistory_retention = \"24h\"\nhistory_max_bytes = \"1MiB\"\n\
                [queues.hooks]\ndestination = \"https://a.example.com/\"\nevents = [\"a.*\"]\n\
                [queues.own]\ndestination = \"https://a.example.com/\"\nevents = [\"a.*\"]\n\
                history_retention = \"0s\"\n\
                [queues.plain]\ndestination = \"https://a.example.com/\"\n\
                [queues.pulled]\nevents = [\"a.*\"]\n";
    let c = Config::parse(text).unwrap();
    let hooks = c.queues["hooks"].settings();
    assert_eq!(hooks.history_retention_ms, 24 * 3_600_000);
    assert_eq!(hooks.history_max_bytes, 1 << 20);
    for name in ["own", "plain", "pulled"] {
        assert_eq!(c.queues[name].settings().history_retention_ms, 0, "{name}");
    }
    let err = Config::parse("[events]\n\nhistory_retention = \"400d\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("line 3: events.history_retention"), "{err}");
    let err = Config::parse("[events]\nhistory_max_bytes = \"10B\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("line 2: events.history_max_bytes"), "{err}");
}
