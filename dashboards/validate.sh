#!/usr/bin/env bash
# Type-check every dashboard in dashboards/json/ against Grafana's own TypeScript types (@grafana/schema),
# pinned, with tsc --noEmit: the dashboard model, variables, gridPos, targets, field config. Panel plugin
# options are untyped there; tests/dashboards/test_dashboards.py checks them against the pinned JSON schemas.
#
#   dashboards/validate.sh [CACHE_DIR]     # default: $ROOFLIGHT_CACHE/grafana-schema or .cache/grafana-schema
#
# Needs node + npm (npm registry access only on the first run; later runs reuse CACHE_DIR).
set -euo pipefail
GRAFANA_SCHEMA_VERSION=13.2.3
TYPESCRIPT_VERSION=5.9.3
here="$(cd "$(dirname "$0")" && pwd)"
cache="${1:-${ROOFLIGHT_CACHE:-$here/../.cache}/grafana-schema}"
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"
if [ ! -f "$cache/node_modules/@grafana/schema/package.json" ] \
   || ! grep -q "\"version\": \"$GRAFANA_SCHEMA_VERSION\"" "$cache/node_modules/@grafana/schema/package.json"; then
  (cd "$cache" && [ -f package.json ] || echo '{"private": true}' > package.json
   npm install --no-audit --no-fund --save-exact \
     "@grafana/schema@$GRAFANA_SCHEMA_VERSION" "typescript@$TYPESCRIPT_VERSION" >/dev/null)
fi
work="$cache/check"
rm -rf "$work" && mkdir -p "$work"
for f in "$here"/json/*.json; do
  name="$(basename "$f" .json | tr -c 'a-zA-Z0-9\n' '_')"
  # An object literal in a .ts file is contextually typed, so enum-like strings are checked exactly
  # (a JSON import would widen them to string) and unknown keys are excess-property errors.
  { echo "import type { AnnotationQuery, Dashboard, DataQuery } from '@grafana/schema';"
    # String enums (ThresholdsMode etc.) as their literal values, which is what JSON holds.
    echo 'type Lit<T> = T extends string ? `${T}` : T extends object ? { [K in keyof T]: Lit<T[K]> } : T;'
    # An annotation's query and formats are its datasource's: @grafana/schema leaves them open
    # (AnnotationQuery<TQuery>), so they are checked here as Prometheus': the query in `target`, the
    # title/text/tag formats on the annotation, where Grafana's Prometheus annotation support reads them.
    echo 'interface PromQuery extends DataQuery { expr: string; interval?: string; instant?: boolean; range?: boolean; legendFormat?: string }'
    echo 'type PromAnnotation = AnnotationQuery<PromQuery> & { titleFormat?: string; textFormat?: string; tagKeys?: string; useValueForTime?: boolean };'
    echo "type Checked = Omit<Dashboard, 'annotations'> & { annotations?: { list?: PromAnnotation[] } };"
    printf 'export const %s: Lit<Checked> = ' "$name"; cat "$f"; echo ';'; } > "$work/$name.ts"
done
cat > "$work/tsconfig.json" <<JSON
{"compilerOptions": {"strict": true, "noEmit": true, "skipLibCheck": true, "moduleResolution": "node",
  "module": "commonjs", "target": "es2020", "typeRoots": [], "baseUrl": "$cache", "paths": {"*": ["node_modules/*"]}},
 "include": ["*.ts"]}
JSON
"$cache/node_modules/.bin/tsc" -p "$work/tsconfig.json"
echo "$(ls "$work"/*.ts | wc -l) dashboards type-check against @grafana/schema@$GRAFANA_SCHEMA_VERSION"
