//! The deployment files agree with each other where they must.

use std::path::Path;

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `deploy/allocator.env` is the one source of the allocator settings;
/// every way of running spoold that the repository ships sets the same.
#[test]
fn every_deployment_sets_the_allocator_settings_of_allocator_env() {
    let env = read("deploy/allocator.env");
    let line = env
        .lines()
        .find(|l| l.starts_with("GLIBC_TUNABLES="))
        .expect("allocator.env sets GLIBC_TUNABLES");
    let value = line.trim_start_matches("GLIBC_TUNABLES=");
    assert!(value.contains("glibc.malloc.tcache_count="), "{value}");
    let expected = [
        ("deploy/Dockerfile", format!("ENV GLIBC_TUNABLES={value}\n")),
        (
            "deploy/systemd/spoold.service",
            format!("Environment=GLIBC_TUNABLES={value}\n"),
        ),
        (
            "deploy/kubernetes/base/deployment.yaml",
            format!("- name: GLIBC_TUNABLES\n              value: \"{value}\"\n"),
        ),
        (
            "deploy/kubernetes/statefulset/statefulset.yaml",
            format!("- name: GLIBC_TUNABLES\n              value: \"{value}\"\n"),
        ),
    ];
    for (path, wanted) in expected {
        let text = read(path);
        assert!(text.contains(&wanted), "{path} does not set {wanted:?}");
        assert_eq!(text.matches("GLIBC_TUNABLES").count(), 1, "{path}");
    }
}
