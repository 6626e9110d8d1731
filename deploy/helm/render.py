#!/usr/bin/env python3
"""Renders the spoold chart as `helm template` would, where Helm cannot be
installed: merges the chart's values.yaml with each -f file (later wins,
maps merged key by key, as Helm does), then runs render/main.go (Go's
text/template, Helm's engine) on the result.

    deploy/helm/render.py [-f values.yaml]... [--name RELEASE] [--json]

--json prints the manifests as one JSON list (for tests/process/helm.rs).
Needs python3 with PyYAML and go.
"""
import argparse
import json
import os
import subprocess
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
CHART = os.path.join(HERE, "spoold")


def merge(base, override):
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value
    return base


def main():
    args = argparse.ArgumentParser()
    args.add_argument("-f", "--values", action="append", default=[])
    args.add_argument("--name", default="spoold")
    args.add_argument("--namespace", default="default")
    args.add_argument("--json", action="store_true")
    opts = args.parse_args()
    with open(os.path.join(CHART, "values.yaml")) as f:
        values = yaml.safe_load(f)
    for path in opts.values:
        with open(path) as f:
            merge(values, yaml.safe_load(f) or {})
    with open(os.path.join(CHART, "Chart.yaml")) as f:
        chart = yaml.safe_load(f)
    context = {
        "Values": values,
        "Chart": {"Name": chart["name"], "Version": chart["version"], "AppVersion": chart["appVersion"]},
        "Release": {"Name": opts.name, "Namespace": opts.namespace, "Service": "Helm"},
    }
    ran = subprocess.run(
        ["go", "run", ".", CHART],
        cwd=os.path.join(HERE, "render"), input=json.dumps(context), capture_output=True, text=True,
    )
    if ran.returncode != 0:
        sys.stderr.write(ran.stderr)
        sys.exit(1)
    if opts.json:
        docs = [d for d in yaml.safe_load_all(ran.stdout) if d is not None]
        json.dump(docs, sys.stdout)
    else:
        sys.stdout.write(ran.stdout)


if __name__ == "__main__":
    main()
