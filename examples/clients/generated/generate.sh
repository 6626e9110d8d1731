#!/usr/bin/env bash
# Generates spoold's clients from its OpenAPI document into OUT:
#   OUT/python/spoold_client  (openapi-python-client, from PyPI)
#   OUT/ts/schema.d.ts        (openapi-typescript, from npm; used with
#                              openapi-fetch at run time)
# and compiles the TypeScript smoke test next to it. Usage:
#   generate.sh DOC OUT [NODE_MODULES]
# NODE_MODULES holds openapi-typescript, openapi-fetch, typescript and @types/node
# (.ci/run installs them in ~/.cache/spoold-clients/node_modules).
set -euo pipefail
doc=$1
out=$2
modules=${3:-$HOME/.cache/spoold-clients/node_modules}
here=$(cd "$(dirname "$0")" && pwd)

mkdir -p "$out/python" "$out/ts"
openapi-python-client generate --path "$doc" --meta none \
  --output-path "$out/python/spoold_client" --overwrite

ln -sfn "$modules" "$out/ts/node_modules"
"$modules/.bin/openapi-typescript" "$doc" --output "$out/ts/schema.d.ts"
cp "$here/smoke.ts" "$out/ts/smoke.ts"
cat > "$out/ts/package.json" <<'JSON'
{ "type": "module", "private": true }
JSON
(cd "$out/ts" && "$modules/.bin/tsc" --strict --target es2022 --module nodenext \
  --moduleResolution nodenext --skipLibCheck smoke.ts)
