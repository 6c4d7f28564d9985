"""deploy/: generated content is fresh, the Helm rule template keeps Prometheus's own templates, the
chart's schema guards the SLO bucket edges, and the image's HEALTHCHECK command works against a real agent.

The heavy checks (helm/kustomize rendering, Kubernetes/operator/compose schemas, promtool, hadolint)
need pinned tools and run in deploy/validate.sh.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from rooflight.agent import __version__
from rooflight.agent.config import agent as agent_config
from deploy import generate
from rooflight.collectors import sglang, vllm
from rooflight.rules.config import RulesConfig
from rooflight.rules.generate import ENGINE_PRESETS
from rooflight.rules.render import render
from demo_procs import stop_process
from support import ROOT, free_port

REPO = ROOT
DEPLOY = REPO / "deploy"


def test_generated_files_are_fresh() -> None:
    assert generate.stale() == []


def test_kustomize_base_rule_is_rules_output_and_dashboards_are_labelled() -> None:
    assert (DEPLOY / "k8s/base/prometheusrule.yaml").read_text() == render(RulesConfig(), "prometheusrule")
    maps = list(yaml.safe_load_all((DEPLOY / "k8s/base/dashboards.yaml").read_text()))
    names = sorted(n for m in maps for n in m["data"])
    assert names == sorted(p.name for p in (REPO / "dashboards/json").glob("*.json"))
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        name, text = next(iter(m["data"].items()))
        assert text == (REPO / "dashboards/json" / name).read_text()


def test_helm_rule_template_escapes_prometheus_templates_and_has_no_sentinels() -> None:
    text = (DEPLOY / "helm/rooflight/templates/prometheusrule.yaml").read_text()
    assert "{{`{{`}} $labels.target {{`}}`}}" in text
    assert not re.search(r"(?<!`)\{\{ \$(labels|value|self)", text)  # an unescaped Prometheus template would break helm
    for sentinel in ("4001.25", "4002.25", "4011.25", "4012.25", "0.9137", "4003m", "4006m", "4007m", "4009m", "sentinel"):
        assert sentinel not in text
    for key in (
        "ttft.thresholdSeconds", "itl.thresholdSeconds", "lowMbu.threshold", "lowMbu.for", "headOfLine.for",
        "runbookBaseUrl", "dashboardBaseUrl", "agentDown.for", "agentAbsent.for", "sourceDown.for", "engine",
        "ttft.byModel", "itl.byModel", "namespace",
    ):  # fmt: skip
        assert f".Values.prometheusRule.{key}" in text, key
    assert "job={{ .Values.agent.job | quote }}" in text


def test_per_model_lines_become_ranges_over_by_model() -> None:
    text = generate.helm_rule_groups()
    # Each SLO window's record and each guard has one line per model with its own threshold, in a range.
    for slo, windows in (("ttft", 7), ("itl", 7)):
        ranges = text.count(f"{{{{- range $m, $t := ${slo}ByModel }}}}")
        assert ranges == windows + 1, (slo, ranges)
        assert text.count(f'"byModel" ${slo}ByModel "braces" true') >= 2 * windows
    line = next(l for l in text.splitlines() if 'model_name="{{ $m }}"' in l and "ttft" not in l.lower())
    assert '{{ include "rooflight.leMatcher" $t }}' in line and line.rstrip().endswith(" or")


def test_values_defaults_are_the_rules_defaults() -> None:
    values = yaml.safe_load((DEPLOY / "helm/rooflight/values.yaml").read_text())
    rule, config = values["prometheusRule"], RulesConfig()
    assert rule["runbookBaseUrl"] == config.runbook_base_url
    assert rule["dashboardBaseUrl"] == config.dashboard_base_url
    assert f'job="{values["agent"]["job"]}"' == config.agent_job_selector
    assert (rule["agentDown"]["for"], rule["agentAbsent"]["for"], rule["sourceDown"]["for"]) == (
        config.agent_down_for, config.agent_absent_for, config.source_down_for,
    )
    assert (rule["engineStartTimeout"]["for"], rule["engineStalled"]["for"], rule["gpuHot"]["celsius"]) == (
        config.engine_start_budget, config.engine_stalled_for, config.gpu_temperature_celsius,
    )
    # the load budget the alert allows is the startup probe's
    probe = values["engine"]["startupProbe"]
    assert f'{probe["periodSeconds"] * probe["failureThreshold"] // 60}m' == rule["engineStartTimeout"]["for"]
    assert rule["engine"] == "vllm" and rule["ttft"]["byModel"] == {} == rule["itl"]["byModel"]
    for monitor in ("podMonitor", "serviceMonitor"):
        assert {"scrapeTimeout", "relabelings", "metricRelabelings"} <= set(values[monitor])


def test_every_agent_scrape_carries_the_job_the_meta_alerts_select() -> None:
    job = RulesConfig().agent_job_selector
    podmonitor = yaml.safe_load((DEPLOY / "k8s/base/podmonitor.yaml").read_text())
    endpoints = {e["port"]: e for e in podmonitor["spec"]["podMetricsEndpoints"]}
    assert {"action": "replace", "targetLabel": "job", "replacement": "rooflight"} in endpoints["metrics"]["relabelings"]
    assert "relabelings" not in endpoints["http"]  # the engine's scrape keeps its own job
    compose = yaml.safe_load((DEPLOY / "compose/prometheus/prometheus.yml").read_text())
    agent_jobs = [c["job_name"] for c in compose["scrape_configs"] if "agent:9746" in str(c)]
    assert [f'job="{j}"' for j in agent_jobs] == [job]
    helpers = (DEPLOY / "helm/rooflight/templates/_helpers.tpl").read_text()
    assert '(dict "action" "replace" "targetLabel" "job" "replacement" $v.agent.job)' in helpers
    block = helpers[helpers.index('{{- if .agent }}\n  {{- $relabelings = append'):]
    assert block.index("{{- end }}") < block.index("extraLabels")  # the job relabeling is the agent's alone


def _flags(values: Path) -> str:
    return "".join(re.findall(r"^# rooflight rules flags: (.*)$", values.read_text(), re.M))


def test_example_values_files_state_their_rules_and_docs_show_the_two_replica_one() -> None:
    chart = DEPLOY / "helm/rooflight"
    files = sorted([*chart.glob("ci/*.yaml"), *chart.glob("examples/*.yaml")])
    assert {p.name for p in files} >= {"custom-values.yaml", "vllm-two-replicas.yaml", "sglang.yaml"}
    defaults = yaml.safe_load((chart / "values.yaml").read_text())
    for path in files:  # a misspelt key would be silently ignored by the chart
        values = yaml.safe_load(path.read_text())
        assert set(values) <= set(defaults), (path.name, set(values) - set(defaults))
        for key, value in values.items():
            if isinstance(value, dict) and isinstance(defaults[key], dict) and defaults[key]:
                assert set(value) <= set(defaults[key]), (path.name, key, set(value) - set(defaults[key]))
    replicas = chart / "examples/vllm-two-replicas.yaml"
    assert yaml.safe_load(replicas.read_text())["replicas"] == 2
    assert replicas.read_text().rstrip() in (REPO / "docs/deploy.md").read_text()
    sglang = yaml.safe_load((chart / "examples/sglang.yaml").read_text())
    assert sglang["prometheusRule"]["engine"] == "sglang" and "--engine sglang" in _flags(chart / "examples/sglang.yaml")
    assert "--enable-metrics" in sglang["engine"]["args"] and sglang["agent"]["engineUrl"].endswith(":30000")
    custom = yaml.safe_load((chart / "ci/custom-values.yaml").read_text())
    assert custom["agent"]["webConfig"]["basicAuthSecret"] and custom["prometheusRule"]["ttft"]["byModel"]


def test_sentinel_collision_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(generate, "REPLACEMENTS", [*generate.REPLACEMENTS, ("for: 5m", "x")])
    try:
        generate.helm_rule_groups()
    except RuntimeError as exc:
        assert "collides" in str(exc)
    else:
        raise AssertionError("a sentinel that is also a real value was accepted")


def test_chart_schema_allows_only_the_engines_bucket_edges() -> None:
    schema = json.loads((DEPLOY / "helm/rooflight/values.schema.json").read_text())
    rule = schema["properties"]["prometheusRule"]
    assert rule["if"] == {"properties": {"engine": {"const": "sglang"}}, "required": ["engine"]}
    for branch, ttft, itl in (
        ("else", vllm.TTFT_EDGES, vllm.ITL_EDGES), ("then", sglang.TTFT_EDGES, sglang.ITL_EDGES),
    ):  # fmt: skip
        for slo, edges in (("ttft", ttft), ("itl", itl)):
            props = rule[branch]["properties"][slo]["properties"]
            assert props["thresholdSeconds"]["enum"] == list(edges), (branch, slo)
            assert props["byModel"]["additionalProperties"]["enum"] == list(edges), (branch, slo)
    assert sorted(rule["properties"]["engine"]["enum"]) == sorted(ENGINE_PRESETS)
    values = yaml.safe_load((DEPLOY / "helm/rooflight/values.yaml").read_text())
    assert values["prometheusRule"]["ttft"]["thresholdSeconds"] == RulesConfig().ttft.threshold_seconds
    assert values["prometheusRule"]["itl"]["thresholdSeconds"] == RulesConfig().itl.threshold_seconds
    assert values["agent"]["listen"] == "0.0.0.0:9746"


def test_dockerfile_pins_the_package_version_and_runs_unprivileged() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    version = __version__  # written once, in agent/__init__.py (pyproject.toml reads it: dynamic)
    assert f"ARG ROOFLIGHT_VERSION={version}" in text
    assert re.search(r"^USER 65532:65532$", text, re.M)
    assert text.count("FROM ") == 2  # build tools stay in the first stage


def _healthcheck_command() -> list[str]:
    line = next(l for l in (DEPLOY / "Dockerfile").read_text().splitlines() if l.strip().startswith("CMD [\"python\""))
    return json.loads(line.strip()[len("CMD "):])


def test_image_healthcheck_command_against_a_real_agent() -> None:
    port = free_port()
    cmd = [sys.executable if c == "python" else c for c in _healthcheck_command()]
    env = {**os.environ, "ROOFLIGHT_LISTEN": f"0.0.0.0:{port}"}
    demo = subprocess.Popen([sys.executable, "-m", "rooflight", "demo", "--listen", f"127.0.0.1:{port}",
                             "--engine-listen", "127.0.0.1:0", "--duration", "30"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/-/healthy", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        assert subprocess.run(cmd, env=env, timeout=10).returncode == 0
    finally:
        stop_process(demo)
    assert subprocess.run(cmd, env=env, timeout=10, stderr=subprocess.DEVNULL).returncode != 0


def test_systemd_example_config_is_a_valid_agent_config() -> None:
    config = agent_config.build(agent_config.load_file(DEPLOY / "systemd/rooflight.yaml"), {}, {})
    assert config.listen == "127.0.0.1:9746"  # local unless a web config guards it (docs/security.md)
    assert config.targets[0].model_config and config.targets[0].url == "http://127.0.0.1:8000"
    unit = (DEPLOY / "systemd/rooflight.service").read_text()
    for option in ("DynamicUser=yes", "ProtectSystem=strict", "NoNewPrivileges=yes", "CapabilityBoundingSet="):
        assert option in unit


# Replicas: the target label names the pod, the rules keep the scrape's topology labels ----------------

POD = "llm-7d9f8c-a"


def _agent_env(deployment: dict) -> list[dict]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "rooflight")["env"]


def _resolve(env: list[dict], pod: str) -> dict[str, str]:
    """The environment Kubernetes gives the container, with the downward API's metadata.name = `pod`."""
    out = {}
    for item in env:
        if "value" in item:
            out[item["name"]] = str(item["value"])
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            out[item["name"]] = pod
    return out


def test_kustomize_sidecar_names_its_target_after_the_pod() -> None:
    env = _agent_env(yaml.safe_load((DEPLOY / "k8s/base/deployment.yaml").read_text()))
    named = [e for e in env if e["name"] == "ROOFLIGHT_TARGET_NAME"]
    assert named == [{"name": "ROOFLIGHT_TARGET_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]


def test_helm_sidecar_names_its_target_after_the_pod_unless_told() -> None:
    text = (DEPLOY / "helm/rooflight/templates/deployment.yaml").read_text()
    block = text[text.index("{{- if .Values.agent.targetName }}"):]
    block = block[: block.index("{{- end }}")]
    assert "ROOFLIGHT_TARGET_NAME, value: {{ .Values.agent.targetName | quote }}" in block
    assert "- name: ROOFLIGHT_TARGET_NAME" in block and "fieldPath: metadata.name" in block
    assert yaml.safe_load((DEPLOY / "helm/rooflight/values.yaml").read_text())["agent"]["targetName"] == ""


def test_the_agent_takes_the_pod_name_as_its_target_label() -> None:
    # The manifests' environment, as the agent's own config code reads it: target = the pod, not 127.0.0.1:8000.
    env = _resolve(_agent_env(yaml.safe_load((DEPLOY / "k8s/base/deployment.yaml").read_text())), POD)
    config = agent_config.build({}, agent_config.env_settings(env), {})
    assert [t.name for t in config.targets] == [POD]
    assert config.targets[0].url == "http://127.0.0.1:8000"


def test_helm_rule_labels_default_to_the_rules_config() -> None:
    values = yaml.safe_load((DEPLOY / "helm/rooflight/values.yaml").read_text())
    assert tuple(values["prometheusRule"]["topologyLabels"]) == RulesConfig().topology_labels
    assert tuple(values["prometheusRule"]["replicaLabels"]) == RulesConfig().replica_labels
    assert values["extraLabels"] == {}
    text = (DEPLOY / "helm/rooflight/templates/prometheusrule.yaml").read_text()
    assert "rooflight_sentinel" not in text
    assert "by ({{ $keep }}target, engine, model, rank)" in text
    assert "by ({{ $service }}model_name)" in text
    assert text.count("$keep") > 20
    for monitor in ("podmonitor.yaml", "servicemonitor.yaml"):
        assert (DEPLOY / "helm/rooflight/templates" / monitor).read_text().count('include "rooflight.endpoint"') == 2
    helpers = (DEPLOY / "helm/rooflight/templates/_helpers.tpl").read_text()
    assert "{{- range $name, $value := $v.extraLabels }}" in helpers


def _schema_refuses_unknown_keys(values: object, schema: dict, where: str) -> list[str]:
    """Every key of values.yaml is declared by the schema, and every declared object refuses others."""
    problems = []
    if isinstance(values, dict) and "properties" in schema:
        if schema.get("additionalProperties") is not False:
            problems.append(f"{where or '/'}: accepts unknown keys")
        for key, value in values.items():
            if key not in schema["properties"]:
                problems.append(f"{where}/{key}: not in the schema")
            else:
                problems += _schema_refuses_unknown_keys(value, schema["properties"][key], f"{where}/{key}")
    return problems


def test_values_schema_declares_every_key_and_refuses_unknown_ones() -> None:
    chart = DEPLOY / "helm/rooflight"
    values = yaml.safe_load((chart / "values.yaml").read_text())
    schema = json.loads((chart / "values.schema.json").read_text())
    assert _schema_refuses_unknown_keys(values, schema, "") == []
    # and a typo is one: the schema alone refuses it (helm applies the same schema; validate.sh checks helm)
    import jsonschema
    typo = dict(values, engine=dict(values["engine"], startupProbes={"failureThreshold": 9}))
    assert list(jsonschema.Draft7Validator(schema).iter_errors(typo))
    assert not list(jsonschema.Draft7Validator(schema).iter_errors(values))


def test_engine_container_restarts_when_hung_but_not_while_loading() -> None:
    """A hung engine is restarted (liveness) only after the startup probe's model-load budget, sized for a
    big model: 30 min by default, longer than liveness' minute by far."""
    text = (DEPLOY / "helm/rooflight/templates/deployment.yaml").read_text()
    engine = text.split("- name: engine", 1)[1].split("- name: rooflight", 1)[0]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert f"{probe}:\n            httpGet: {{path: {{{{ .Values.engine.healthPath }}}}" in engine
        assert f".Values.engine.{probe}" in engine
    assert "preStop" in engine and ".Values.engine.securityContext" in engine
    values = yaml.safe_load((DEPLOY / "helm/rooflight/values.yaml").read_text())["engine"]
    budget = values["startupProbe"]["periodSeconds"] * values["startupProbe"]["failureThreshold"]
    hung = values["livenessProbe"]["periodSeconds"] * values["livenessProbe"]["failureThreshold"]
    assert budget >= 20 * 60 and hung <= 120 and budget >= 10 * hung


def test_agent_security_context_comes_from_values() -> None:
    text = (DEPLOY / "helm/rooflight/templates/deployment.yaml").read_text()
    agent = text.split("- name: rooflight", 1)[1]
    assert ".Values.agent.securityContext" in agent and "runAsUser: 65532" not in agent
    sc = yaml.safe_load((DEPLOY / "helm/rooflight/values.yaml").read_text())["agent"]["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["capabilities"] == {"drop": ["ALL"]}


def test_engine_releases_install_no_rules_dashboards_or_routes_and_drain_their_streams() -> None:
    """Rules, dashboards and the AlertmanagerConfig are once per cluster: a second engine release with the
    chart's defaults must not record every series twice or page twice. vLLM aborts its streams on SIGTERM
    unless --shutdown-timeout is set: the chart sets it to the grace period left after the preStop sleep.
    The agent's sidecar has no readinessProbe (it must not pull a serving engine out of the Service), and the
    engine asks for resources beside its GPU."""
    values = yaml.safe_load((DEPLOY / "helm/rooflight/values.yaml").read_text())
    assert [values[k]["enabled"] for k in ("prometheusRule", "dashboards", "alertmanagerConfig")] == [False] * 3
    assert values["engine"]["shutdownTimeoutFlag"] == "--shutdown-timeout"
    assert values["engine"]["resources"]["requests"]["cpu"] and values["engine"]["resources"]["requests"]["memory"]
    assert values["agent"]["canary"] is True
    text = (DEPLOY / "helm/rooflight/templates/deployment.yaml").read_text()
    agent = text.split("- name: rooflight", 1)[1]
    assert "readinessProbe:" not in agent.replace("No readinessProbe:", "")
    assert "sub (int $.Values.terminationGracePeriodSeconds) (int $.Values.engine.preStopSleepSeconds)" in text
    base = (DEPLOY / "k8s/base/deployment.yaml").read_text().split("- name: rooflight", 1)[1]
    assert "readinessProbe:" not in base.replace("No readinessProbe:", "")
