#!/usr/bin/env bash
# Type-checks grafana/spoold.json against @grafana/schema's Dashboard type
# (no Grafana server runs here), then checks its queries with promtool.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
npm init -y >/dev/null 2>&1
npm install --silent --no-audit --no-fund @grafana/schema@13 typescript@5 >/dev/null
{
  echo 'import type { Dashboard } from "@grafana/schema";'
  printf 'const dashboard: Dashboard = '
  cat "$root/grafana/spoold.json"
  echo ';'
  echo 'export default dashboard;'
} > check.ts
npx tsc --noEmit --strict --skipLibCheck --module esnext --moduleResolution bundler --target es2020 check.ts
echo "dashboard: type-checks against @grafana/schema $(node -p 'require("@grafana/schema/package.json").version')"
python3 "$root/.ci/check-dashboard.py"
