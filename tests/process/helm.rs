//! The Helm chart (`deploy/helm/spoold`), rendered and checked: each
//! example's manifests pass `kubernetes-validate --strict`, every
//! `spoold.toml` the chart writes passes `spoold check-config`, and each
//! shape has what it promises (a native sidecar beside the app; one
//! replica; a 3-replica cluster with one config per replica, a
//! PodDisruptionBudget, monitors and a NetworkPolicy). Helm cannot be
//! installed here: `deploy/helm/render.py` renders with Go's text/template,
//! Helm's own engine.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// `render.py` with `args`: the manifests as JSON, or its error.
fn render(args: &[&str]) -> Result<Vec<Value>, String> {
    let out = Command::new("python3")
        .arg(format!("{ROOT}/deploy/helm/render.py"))
        .args(args)
        .arg("--json")
        .output()
        .expect("python3 runs");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).expect("render.py prints JSON"))
}

fn example(name: &str) -> String {
    format!("{ROOT}/deploy/helm/examples/{name}.yaml")
}

fn find<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn kinds(docs: &[Value]) -> Vec<String> {
    let mut kinds: Vec<String> = docs
        .iter()
        .map(|d| d["kind"].as_str().unwrap().to_owned())
        .collect();
    kinds.sort();
    kinds
}

/// Runs `command`, which must succeed (`what` names it in the failure);
/// returns its standard output.
fn succeed(command: &mut Command, what: &str) -> Vec<u8> {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `kubernetes-validate --strict` on the chart rendered with `values`.
fn validate(values: &str, dir: &Path) {
    let rendered = succeed(
        Command::new("python3")
            .arg(format!("{ROOT}/deploy/helm/render.py"))
            .args(["-f", values]),
        values,
    );
    let file = dir.join("rendered.yaml");
    std::fs::write(&file, rendered).unwrap();
    succeed(
        Command::new("kubernetes-validate")
            .args(["--strict", "--quiet", "--kubernetes-version", "1.30.0"])
            .arg(&file),
        values,
    );
}

/// Every config file of the chart's ConfigMap passes `spoold
/// check-config` (as the pods would read it); returns them by name.
fn check_configs(docs: &[Value], dir: &Path) -> Vec<(String, String)> {
    let maps = find(docs, "ConfigMap");
    assert_eq!(maps.len(), 1);
    let mut files = Vec::new();
    for (name, text) in maps[0]["data"].as_object().unwrap() {
        let text = text.as_str().unwrap().to_owned();
        let path = dir.join(name);
        std::fs::write(&path, &text).unwrap();
        succeed(
            Command::new(env!("CARGO_BIN_EXE_spoold"))
                .args(["check-config", "--config"])
                .arg(&path)
                // What the pods get from the Secret.
                .env("SPOOLD_API_KEYS", "key-of-the-apps")
                .env("SPOOLD_CLUSTER_SECRET", "0123456789abcdef0123456789abcdef"),
            &format!("{name}:\n{text}"),
        );
        files.push((name.clone(), text));
    }
    files
}

fn container<'a>(pod: &'a Value, list: &str, name: &str) -> &'a Value {
    pod[list]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {list} {name}: {pod}"))
}

#[test]
#[ignore = "needs go, python3 with PyYAML, and kubernetes-validate (.ci/run installs them)"]
fn the_sidecar_shape_puts_spoold_beside_the_app() {
    let dir = tempfile::tempdir().unwrap();
    validate(&example("sidecar"), dir.path());
    let docs = render(&["-f", &example("sidecar")]).unwrap();
    assert_eq!(kinds(&docs), ["ConfigMap", "Deployment", "PodMonitor"]);
    let pod = &find(&docs, "Deployment")[0]["spec"]["template"]["spec"];
    let spoold = container(pod, "initContainers", "spoold");
    assert_eq!(spoold["restartPolicy"], "Always", "a native sidecar");
    assert_eq!(spoold["startupProbe"]["httpGet"]["path"], "/readyz");
    let app = container(pod, "containers", "shop");
    let env: Vec<&str> = app["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(env, ["SPOOLD_URL", "SPOOLD_API_KEY", "SHOP_MODE"]);
    let configs = check_configs(&docs, dir.path());
    assert!(
        configs[0].1.contains("listen = \"127.0.0.1:8787\""),
        "loopback only"
    );
}

#[test]
#[ignore = "needs go, python3 with PyYAML, and kubernetes-validate (.ci/run installs them)"]
fn the_standalone_shape_is_one_replica_on_its_volume() {
    let dir = tempfile::tempdir().unwrap();
    validate(&example("standalone"), dir.path());
    let docs = render(&["-f", &example("standalone"), "--name", "outbox"]).unwrap();
    assert_eq!(
        kinds(&docs),
        [
            "ConfigMap",
            "NetworkPolicy",
            "PodMonitor",
            "Service",
            "Service",
            "StatefulSet"
        ]
    );
    let set = find(&docs, "StatefulSet")[0];
    assert_eq!(set["metadata"]["name"], "outbox-spoold");
    assert_eq!(set["spec"]["replicas"], 1);
    assert_eq!(
        set["spec"]["template"]["spec"]["imagePullSecrets"][0]["name"],
        "registry"
    );
    let ports = &container(&set["spec"]["template"]["spec"], "containers", "spoold")["ports"];
    assert!(!ports.to_string().contains("raft"), "{ports}");
    check_configs(&docs, dir.path());
}

#[test]
#[ignore = "needs go, python3 with PyYAML, and kubernetes-validate (.ci/run installs them)"]
fn the_cluster_shape_gives_each_replica_its_config_and_keeps_a_majority() {
    let dir = tempfile::tempdir().unwrap();
    validate(&example("cluster"), dir.path());
    let docs = render(&["-f", &example("cluster")]).unwrap();
    assert_eq!(
        kinds(&docs),
        [
            "ConfigMap",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "PodMonitor",
            "Service",
            "Service",
            "Service",
            "ServiceMonitor",
            "StatefulSet"
        ]
    );
    let set = find(&docs, "StatefulSet")[0];
    assert_eq!(set["spec"]["replicas"], 3);
    assert_eq!(set["spec"]["podManagementPolicy"], "Parallel");
    let claim = &set["spec"]["volumeClaimTemplates"][0]["spec"];
    assert_eq!(claim["storageClassName"], "fast-ssd");
    let spoold = container(&set["spec"]["template"]["spec"], "containers", "spoold");
    assert!(spoold["env"].to_string().contains("SPOOLD_CLUSTER_SECRET"));
    let configs = check_configs(&docs, dir.path());
    let names: Vec<&str> = configs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["spoold-0.toml", "spoold-1.toml", "spoold-2.toml"]);
    for (i, (_, text)) in configs.iter().enumerate() {
        assert!(text.contains(&format!("node_id = {}", i + 1)), "{text}");
        assert!(
            text.contains(&format!("advertise = \"spoold-{i}.spoold-peers:8788\"")),
            "{text}"
        );
    }
    assert_eq!(
        find(&docs, "PodDisruptionBudget")[0]["spec"]["maxUnavailable"],
        1
    );
    let policy = find(&docs, "NetworkPolicy")[0].to_string();
    assert!(
        policy.contains("\"kubernetes.io/metadata.name\":\"shop\""),
        "{policy}"
    );
    assert!(policy.contains("raft"), "{policy}");
}

#[test]
#[ignore = "needs go and python3 with PyYAML (.ci/run installs them)"]
fn bad_values_are_refused_with_the_key_named() {
    let dir = tempfile::tempdir().unwrap();
    let four = dir.path().join("four.yaml");
    std::fs::write(&four, "mode: cluster\ncluster:\n  replicas: 4\n").unwrap();
    let err = render(&["-f", four.to_str().unwrap()]).unwrap_err();
    assert!(err.contains("cluster.replicas: 3, 5 or 7"), "{err}");
    let no_secret = dir.path().join("no-secret.yaml");
    std::fs::write(&no_secret, "auth:\n  existingSecret: \"\"\n").unwrap();
    let err = render(&["-f", no_secret.to_str().unwrap()]).unwrap_err();
    assert!(err.contains("auth.existingSecret"), "{err}");
}
