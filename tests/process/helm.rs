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

/// Kinds `kubernetes-validate` has no schema for: left out of the check,
/// by name (their own tests say what they hold).
const NOT_VALIDATED: [&str; 1] = ["Certificate"];

/// `kubernetes-validate --strict` on the chart rendered with `values`.
fn validate(values: &str, dir: &Path) {
    let docs = render(&["-f", values]).unwrap_or_else(|e| panic!("{values}: {e}"));
    // JSON is YAML: one document each.
    let rendered: Vec<String> = docs
        .iter()
        .filter(|d| !NOT_VALIDATED.iter().any(|k| d["kind"] == *k))
        .map(Value::to_string)
        .collect();
    let file = dir.join("rendered.yaml");
    std::fs::write(&file, rendered.join("\n---\n")).unwrap();
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
            "ServiceAccount",
            "StatefulSet"
        ]
    );
    let set = find(&docs, "StatefulSet")[0];
    assert_eq!(set["metadata"]["name"], "outbox-spoold");
    let pod = &set["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "outbox-spoold");
    assert_eq!(pod["automountServiceAccountToken"], false);
    let account = find(&docs, "ServiceAccount")[0];
    assert_eq!(account["automountServiceAccountToken"], false);
    assert!(
        pod.get("affinity").is_none(),
        "one replica: no anti-affinity"
    );
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
            "ServiceAccount",
            "ServiceMonitor",
            "StatefulSet"
        ]
    );
    let set = find(&docs, "StatefulSet")[0];
    assert_eq!(set["spec"]["replicas"], 3);
    // By default the replicas take different nodes and spread over zones.
    let pod = &set["spec"]["template"]["spec"];
    let anti =
        &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(anti["topologyKey"], "kubernetes.io/hostname");
    let spread = &pod["topologySpreadConstraints"][0];
    assert_eq!(
        (&spread["topologyKey"], &spread["whenUnsatisfiable"]),
        (
            &serde_json::json!("topology.kubernetes.io/zone"),
            &serde_json::json!("ScheduleAnyway")
        )
    );
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

/// Replicated mode with mutual TLS, its certificate from cert-manager:
/// one `Certificate` naming every replica's peer name, its Secret mounted
/// where each `[cluster.tls]` looks, and the configs pass `check-config`
/// with real files there. The example also sets a full name of its own,
/// node selection and tolerations, spread constraints of its own and the
/// account's annotations.
#[test]
#[ignore = "needs go, python3 with PyYAML, and kubernetes-validate (.ci/run installs them)"]
fn the_cluster_shape_with_tls_mounts_its_certificate_where_the_config_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    validate(&example("cluster-tls"), dir.path());
    let docs = render(&["-f", &example("cluster-tls")]).unwrap();
    let certificate = find(&docs, "Certificate")[0];
    assert_eq!(certificate["spec"]["secretName"], "events-peer-tls");
    assert_eq!(certificate["spec"]["issuerRef"]["kind"], "ClusterIssuer");
    assert_eq!(
        certificate["spec"]["dnsNames"],
        serde_json::json!([
            "events-peers",
            "events-0.events-peers",
            "events-1.events-peers",
            "events-2.events-peers"
        ])
    );
    let set = find(&docs, "StatefulSet")[0];
    assert_eq!(set["metadata"]["name"], "events");
    let pod = &set["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["workload"], "queues");
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert_eq!(
        pod["topologySpreadConstraints"][0]["whenUnsatisfiable"],
        "DoNotSchedule"
    );
    assert_eq!(pod["serviceAccountName"], "events");
    let account = find(&docs, "ServiceAccount")[0];
    assert_eq!(
        account["metadata"]["annotations"]["example.com/owner"],
        "platform"
    );
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "peer-tls")
        .expect("the TLS volume");
    assert_eq!(volume["secret"]["secretName"], "events-peer-tls");
    let spoold = container(pod, "containers", "spoold");
    assert!(
        spoold["volumeMounts"]
            .to_string()
            .contains("/etc/spoold-tls")
    );

    // Real files where the configs look (a CA and a replica's certificate),
    // so that check-config loads them as a replica would.
    let (ca, cert, key) = crate::common::certificates(&["events-peers"]);
    let tls = dir.path().join("tls");
    std::fs::create_dir(&tls).unwrap();
    for (name, pem) in [("ca.crt", &ca), ("tls.crt", &cert), ("tls.key", &key)] {
        std::fs::write(tls.join(name), pem).unwrap();
    }
    let mut moved = find(&docs, "ConfigMap")[0].clone();
    for text in moved["data"].as_object_mut().unwrap().values_mut() {
        let with_tls = text
            .as_str()
            .unwrap()
            .replace("/etc/spoold-tls", &tls.display().to_string());
        assert!(with_tls.contains("[cluster.tls]"), "{with_tls}");
        *text = Value::String(with_tls);
    }
    let configs = check_configs(&[moved], dir.path());
    assert_eq!(configs.len(), 3);
}
