#!/usr/bin/env python3
"""Checks grafana/spoold.json without a Grafana server.

1. Every panel query is valid PromQL: the expressions are written out as
   recording rules (Grafana's `$queue`, `$pod` and `$__rate_interval`
   replaced by plain values) and checked with `promtool check rules`.
2. Every query names only metrics that spoold exports (src/metrics.rs).
3. The dashboard has a datasource variable, no hard-coded datasource uid,
   and `queue` and `pod` variables; every query filters by `$pod`.
The TypeScript type-check against @grafana/schema is in check-dashboard.sh;
that a running cluster exports every metric the queries name, from its
start, is tests/cluster/dashboard.rs.
"""
import json
import pathlib
import re
import subprocess
import sys
import tempfile

root = pathlib.Path(__file__).resolve().parent.parent
dash = json.loads((root / "grafana/spoold.json").read_text())
metrics_rs = (root / "src/metrics.rs").read_text()
exported = set(re.findall(r'"(spoold_[a-z_]+)"', metrics_rs))

errors = []
names = [v["name"] for v in dash["templating"]["list"]]
if not {"datasource", "queue", "pod"} <= set(names):
    errors.append(f"template variables must include datasource, queue and pod, got {names}")

exprs = []
for panel in dash["panels"]:
    for target in panel.get("targets", []):
        uid = target.get("datasource", {}).get("uid", "")
        if uid != "${datasource}":
            errors.append(f"panel {panel['title']!r}: hard-coded datasource uid {uid!r}")
        expr = target["expr"]
        exprs.append((panel["title"], expr))
        if 'pod=~"$pod"' not in expr:
            errors.append(f"panel {panel['title']!r}: query does not filter by pod=~\"$pod\": {expr}")
        for metric in re.findall(r"\b(spoold_[a-z_]+?)(?:_bucket|_count|_sum)?\b", expr):
            base = re.sub(r"_(bucket|count|sum)$", "", metric)
            if base not in exported and metric not in exported:
                errors.append(f"panel {panel['title']!r}: {metric} is not exported by spoold")

rules = {"groups": [{"name": "dashboard", "rules": [
    {"record": f"dashboard:panel_{i}", "expr": expr.replace("$__rate_interval", "5m").replace("$queue", ".*").replace("$pod", ".*")}
    for i, (_, expr) in enumerate(exprs)
]}]}
with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
    json.dump(rules, f)
    rules_path = f.name
check = subprocess.run(["promtool", "check", "rules", rules_path], capture_output=True, text=True)
if check.returncode != 0:
    errors.append("promtool check rules failed:\n" + check.stdout + check.stderr)

if errors:
    print("\n".join(errors))
    sys.exit(1)
print(f"dashboard: {len(exprs)} queries valid PromQL, all metrics exported, datasource templated, all filtered by pod")
