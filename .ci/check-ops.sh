#!/usr/bin/env bash
# Validates what cannot run here: alert rules (promtool, with unit tests),
# the Grafana dashboard (@grafana/schema type-check, PromQL), the
# Kubernetes manifests (kustomize + kubernetes-validate --strict), YAML
# style (yamllint), and the Dockerfile (hadolint). Needs promtool, kubectl,
# kubernetes-validate, yamllint, hadolint, node/npm; .ci/run installs them.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "-- alert rules"
promtool check rules deploy/prometheus/alerts.yml
(cd deploy/prometheus && promtool test rules alerts.test.yml)

echo "-- dashboard"
bash .ci/check-dashboard.sh

echo "-- kubernetes manifests"
for overlay in deploy/kubernetes/base deploy/kubernetes/statefulset deploy/kubernetes/cluster; do
  kubectl kustomize "$overlay" > "$overlay.rendered.yaml.tmp"
  kubernetes-validate --strict --quiet --kubernetes-version 1.30.0 "$overlay.rendered.yaml.tmp"
  rm -f "$overlay.rendered.yaml.tmp"
  echo "$overlay: valid"
done

echo "-- yaml style"
yamllint -s -c .yamllint.yml deploy .yamllint.yml

echo "-- Dockerfile"
hadolint deploy/Dockerfile
echo "ops files: all checks passed"
