#!/usr/bin/env bash
# Type-check every dashboard against Grafana's own TypeScript types, pinned, with tsc --noEmit:
# - the whole dashboard against @grafana/schema (model, variables, gridPos, targets, field config), and
# - each panel's plugin options and custom field config (untyped in @grafana/schema) against the types
#   @grafana/grafana-foundation-sdk generates for its plugin, at the version of the Python SDK that
#   generates the dashboards (pyproject.toml). A panel type the SDK has no types for fails the check.
# dashboards/tsgen.py writes the TypeScript: object literals, so unknown keys are excess-property errors.
#
#   dashboards/validate.sh [CACHE_DIR [JSON_DIR]]  # CACHE_DIR default: $ROOFLIGHT_CACHE/grafana-schema or
#                                                  # .cache/grafana-schema; JSON_DIR default: dashboards/json
#
# Needs node + npm (npm registry access only on the first run; later runs reuse CACHE_DIR) and python3.
set -euo pipefail
GRAFANA_SCHEMA_VERSION=13.2.3
GRAFANA_FOUNDATION_SDK_VERSION=0.0.21  # = pyproject.toml's grafana-foundation-sdk~=0.0.21
TYPESCRIPT_VERSION=5.9.3
here="$(cd "$(dirname "$0")" && pwd)"
cache="${1:-${ROOFLIGHT_CACHE:-$here/../.cache}/grafana-schema}"
json_dir="${2:-$here/json}"
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"
sdk="$cache/node_modules/@grafana/grafana-foundation-sdk"
installed() {  # installed PACKAGE_DIR VERSION (the SDK writes its version with a leading v)
  [ -f "$1/package.json" ] && grep -Eq "\"version\": \"v?$2\"" "$1/package.json"
}
if ! installed "$cache/node_modules/@grafana/schema" "$GRAFANA_SCHEMA_VERSION" \
   || ! installed "$sdk" "$GRAFANA_FOUNDATION_SDK_VERSION" \
   || ! installed "$cache/node_modules/typescript" "$TYPESCRIPT_VERSION"; then
  (cd "$cache" && { [ -f package.json ] || echo '{"private": true}' > package.json; }
   npm install --no-audit --no-fund --save-exact "@grafana/schema@$GRAFANA_SCHEMA_VERSION" \
     "@grafana/grafana-foundation-sdk@$GRAFANA_FOUNDATION_SDK_VERSION" "typescript@$TYPESCRIPT_VERSION" >/dev/null)
fi
work="$(mktemp -d -t rooflight-dashboards.XXXXXX)"  # in $TMPDIR; kept when the check fails
"${PYTHON:-python3}" "$here/tsgen.py" --sdk "$sdk" --out "$work" "$json_dir"/*.json || { rm -rf "$work"; exit 1; }
cat > "$work/tsconfig.json" <<JSON
{"compilerOptions": {"strict": true, "noEmit": true, "skipLibCheck": true, "moduleResolution": "node",
  "module": "commonjs", "target": "es2020", "typeRoots": [], "baseUrl": "$cache", "paths": {"*": ["node_modules/*"]}},
 "include": ["**/*.ts"]}
JSON
# tsc's errors name the file, and each panel's file is named after its dashboard, panel id and title.
if ! (cd "$work" && "$cache/node_modules/.bin/tsc" -p tsconfig.json --pretty false); then
  echo "dashboard type check FAILED; the checked files are kept in $work" >&2
  exit 1
fi
rm -rf "$work"
echo "$(ls "$json_dir"/*.json | wc -l) dashboards type-check against @grafana/schema@$GRAFANA_SCHEMA_VERSION" \
  "and their panels' options against @grafana/grafana-foundation-sdk@$GRAFANA_FOUNDATION_SDK_VERSION"
