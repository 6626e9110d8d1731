//! The README's quick start, run as written: every `sh` block of its
//! "Quick start" section, command by command (`bash -e -x`, each `curl`
//! failing on an error status), against the binary started in a scratch
//! directory. Only the address changes (a free port for 8787) and the
//! first line, `cargo run --release &`, which the test replaces by the
//! binary it already built.

use crate::common;

use std::process::Command;

use crate::common::process::start_in;

/// The `sh` blocks between "## Quick start" and the next "## ".
fn quick_start_blocks() -> Vec<String> {
    let readme = include_str!("../../README.md");
    let start = readme
        .find("## Quick start")
        .expect("a Quick start section");
    let rest = &readme[start + 3..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    section
        .split("```sh\n")
        .skip(1)
        .map(|block| block[..block.find("```").expect("a closed block")].to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs bash and curl (.ci/run has them)"]
async fn the_quick_start_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut spoold = start_in(dir.path(), &["--listen", "127.0.0.1:0"]).await;
    let port = spoold.base.rsplit(':').next().unwrap().to_string();
    let blocks = quick_start_blocks();
    assert!(blocks.len() >= 2, "{blocks:?}");
    assert!(
        blocks[0].starts_with("cargo run --release &"),
        "{}",
        blocks[0]
    );
    for block in &blocks {
        let script = block
            .replacen("cargo run --release &", "", 1)
            .replace("localhost:8787", &format!("127.0.0.1:{port}"));
        // An error status fails the command, and the script stops there
        // (a command that already says `-f` keeps its own choice).
        let wrapper = r#"curl() { case " $* " in *" -f"*) command curl "$@" ;; *) command curl --fail-with-body "$@" ;; esac; }"#;
        let script = format!("{wrapper}\n{script}");
        let out = Command::new("timeout")
            .args(["60", "bash", "-e", "-x", "-o", "pipefail", "-c", &script])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // What the quick start did: one message sent, nacked once, acked.
    let orders = spoold.api().get_json("/v1/queues/orders").await;
    assert_eq!(orders["stats"]["ackedTotal"], 1, "{orders}");
    assert_eq!(orders["stats"]["nackedTotal"], 1, "{orders}");
    let billing = spoold.api().get_json("/v1/queues/billing").await;
    assert_eq!(billing["stats"]["sentTotal"], 1, "{billing}");
    // The webhooks example: both events (the second with an ordering
    // key) reached the audit queue, and the endpoint (deleted at the end)
    // took them too.
    let audit = spoold.api().get_json("/v1/queues/audit").await;
    assert_eq!(audit["stats"]["sentTotal"], 2, "{audit}");
    let peeked = spoold.api().get_json("/v1/queues/audit/messages").await;
    assert_eq!(peeked["messages"][1]["orderingKey"], "acct-9", "{peeked}");
    assert_eq!(audit["settings"]["events"], serde_json::json!([">"]));
    assert_eq!(spoold.stop(), 0);
}

/// The README tells of every subcommand the binary has, and says nothing
/// of what is done as if it were missing (it said replicated mode "does
/// not exist yet" long after it did).
#[test]
fn the_readme_names_every_subcommand_and_no_missing_feature_that_exists() {
    let readme = include_str!("../../README.md");
    let help = Command::new(common::process::bin())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let commands: Vec<&str> = help
        .split("Commands:")
        .nth(1)
        .expect("a command list")
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() >= 8, "{help}");
    for command in commands {
        assert!(
            readme.contains(&format!("spoold {command}")),
            "the README never shows `spoold {command}`"
        );
    }
    assert!(!readme.contains("does not exist yet"), "a stale claim");
}
