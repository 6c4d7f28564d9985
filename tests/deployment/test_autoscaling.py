"""deploy/k8s/autoscaling: the KEDA ScaledObjects, the prometheus-adapter rules and the HPAs scale each pool
(decode, prefill, and an aggregated one of role both) on its own role's saturation demand, pass the content
checks deploy/validate.sh runs (deploy/autoscaling.py), and their queries, run by promtool over the
generated rules, give docs/deploy.md's worked examples: the steady pools, and a burst that asks for its
pods in one step.

The CRD schemas (npm @kubernetes-models/keda) and the Kubernetes schemas are checked by deploy/validate.sh.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy import autoscaling
from rooflight.agent.config import agent as agent_config
from rooflight.rules.capacity import demand_record, saturation_record
from rooflight.rules.config import RulesConfig
from rooflight.rules.generate import OUTPUTS
from support import ROOT

EXAMPLES = ROOT / "deploy" / "k8s" / "autoscaling"
CHART_EXAMPLES = ROOT / "deploy" / "helm" / "rooflight" / "examples"
DOCS = ROOT / "docs" / "deploy.md"


def example_docs() -> list[tuple[str, dict[str, Any]]]:
    """Every document of the autoscaling examples, as kustomize would render them (no patches there)."""
    out = []
    for path in sorted(EXAMPLES.glob("*/*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        out += [(f"{path.parent.name}/{path.name}", d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in example_docs() if d["kind"] == kind}


def adapter_rules() -> dict[str, dict[str, Any]]:
    """The adapter's rules by the custom-metric name they serve."""
    config = next(c for _, d in example_docs() if (c := autoscaling.adapter_config(d)) is not None)
    return {rule["name"]["as"]: rule for rule in config["rules"]}


def trigger(name: str) -> dict[str, str]:
    return by_kind("ScaledObject")[name]["spec"]["triggers"][0]["metadata"]


def quantity(text: str) -> float:
    """A Kubernetes quantity as the HPA reads it: 800m = 0.8."""
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


# The examples are what the checks want ------------------------------------------------------------------


def test_every_example_passes_the_content_checks() -> None:
    docs = example_docs()
    assert {d["kind"] for _, d in docs} == {"ScaledObject", "ConfigMap", "HorizontalPodAutoscaler"}
    assert autoscaling.check(docs) == []


# Each pool's ScaledObject / HPA name (its Deployment) and threshold; llm-rooflight is the chart's
# examples/vllm-two-replicas.yaml installed as release llm (no fullnameOverride: <release>-rooflight).
POOLS = {"decode": ("llm-decode", 0.8), "prefill": ("llm-prefill", 0.7), "both": ("llm-rooflight", 0.8)}


def test_each_pool_scales_on_its_own_roles_saturation_demand_record() -> None:
    record = demand_record(RulesConfig())
    assert record in autoscaling.records() and record in OUTPUTS["yaml"].read_text()
    scaled, hpas, rules = by_kind("ScaledObject"), by_kind("HorizontalPodAutoscaler"), adapter_rules()
    assert set(scaled) == set(hpas) == {name for name, _ in POOLS.values()}
    for pool, (name, threshold) in POOLS.items():
        meta = trigger(name)
        assert saturation_record(RulesConfig()) not in meta["query"]  # capped at 1: blind to a queue
        assert record in meta["query"] and f'role="{pool}"' in meta["query"] and f'pod=~"{name}-.+"' in meta["query"]
        assert meta["query"].startswith("sum(max by (namespace, pod) (")  # a pod's hottest rank, summed over pods
        assert float(meta["threshold"]) == threshold and meta["ignoreNullValues"] == "false"
        spec = scaled[name]["spec"]
        assert spec["scaleTargetRef"]["name"] == hpas[name]["spec"]["scaleTargetRef"]["name"] == name
        assert spec["triggers"][0]["metricType"] == "AverageValue"  # replicas = ceil(sum / threshold)
        assert spec["fallback"]["behavior"] == "currentReplicasIfHigher"  # never scale in on missing data
        metric = hpas[name]["spec"]["metrics"][0]["pods"]
        assert metric["target"]["type"] == "AverageValue" and quantity(metric["target"]["averageValue"]) == threshold
        rule = rules[metric["metric"]["name"]]
        assert f'role="{pool}"' in rule["seriesQuery"] and f'role="{pool}"' in rule["metricsQuery"]
        assert record in rule["seriesQuery"]
        for behavior in (spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"], hpas[name]["spec"]["behavior"]):
            # a burst's ask in one step: 4 pods may become 16 within a minute (+300%)
            assert {"type": "Percent", "value": 300, "periodSeconds": 60} in behavior["scaleUp"]["policies"], name
        assert spec["maxReplicaCount"] == hpas[name]["spec"]["maxReplicas"] == 16
        if pool == "both":  # the aggregated example: role both by default (no KV connector), release llm
            text = (CHART_EXAMPLES / "vllm-two-replicas.yaml").read_text()
            values = yaml.safe_load(text)
            assert "helm install llm deploy/helm/rooflight" in text and "fullnameOverride" not in values
            assert "role" not in values["agent"] and not any("kv-transfer" in a for a in values["engine"]["args"])
            continue
        # The Helm example of the pool names its Deployment and tells the agent its role.
        values = yaml.safe_load((CHART_EXAMPLES / f"vllm-{pool}-pool.yaml").read_text())
        assert values["fullnameOverride"] == name and values["agent"]["role"] == pool


def test_only_one_pool_release_ships_the_rules_and_dashboards() -> None:
    decode = yaml.safe_load((CHART_EXAMPLES / "vllm-decode-pool.yaml").read_text())
    prefill = yaml.safe_load((CHART_EXAMPLES / "vllm-prefill-pool.yaml").read_text())
    defaults = yaml.safe_load((CHART_EXAMPLES.parent / "values.yaml").read_text())
    # the chart installs neither by default (once per cluster); the decode release turns both on
    assert defaults["prometheusRule"]["enabled"] is False and defaults["dashboards"]["enabled"] is False
    assert decode["prometheusRule"]["enabled"] is True and decode["dashboards"]["enabled"] is True
    assert "prometheusRule" not in prefill and "dashboards" not in prefill
    assert decode["agent"]["gpuHourCost"] == prefill["agent"]["gpuHourCost"] > 0


# The chart's capacity values reach the agent as the settings it reads.
AGENT_VALUES = {"role": "ROOFLIGHT_ROLE", "ttftSlo": "ROOFLIGHT_TTFT_SLO", "itlSlo": "ROOFLIGHT_ITL_SLO",
                "gpuHourCost": "ROOFLIGHT_GPU_HOUR_COST"}


def test_the_charts_capacity_values_become_the_agents_settings() -> None:
    template = (ROOT / "deploy/helm/rooflight/templates/deployment.yaml").read_text()
    defaults = yaml.safe_load((ROOT / "deploy/helm/rooflight/values.yaml").read_text())["agent"]
    for key, env in AGENT_VALUES.items():
        assert f"{{{{- with .Values.agent.{key} }}}}\n            - {{name: {env}, value:" in template, key
        assert env.removeprefix("ROOFLIGHT_").lower() in agent_config.ENV_KEYS, env
        assert not defaults[key], key  # off unless set: no role, SLO or price is guessed
    # The decode pool example's values, as `helm template` writes them (`with` skips the unset ones).
    values = yaml.safe_load((CHART_EXAMPLES / "vllm-decode-pool.yaml").read_text())["agent"]
    env = {AGENT_VALUES[k]: str(v) for k, v in values.items() if k in AGENT_VALUES and v}
    env["ROOFLIGHT_ENGINE_URL"] = "http://127.0.0.1:8000"
    config = agent_config.build({}, agent_config.env_settings(env), {})
    target = config.targets[0]
    assert (target.role, target.itl_slo, target.ttft_slo, target.gpu_hour_cost) == ("decode", 0.05, None, 2.5)


def test_our_own_schemas_say_they_are_written_from_the_projects_docs() -> None:
    text = DOCS.read_text()
    for path in (autoscaling.ADAPTER_SCHEMA, autoscaling.KEDA_TRIGGER_SCHEMA):
        schema = json.loads(path.read_text())
        assert schema["$comment"].startswith("Written by Rooflight"), path.name
        assert f"deploy/schemas/{path.name}" in text, path.name
    assert "@kubernetes-models/keda" in text


# The checks catch what the CRD schemas cannot --------------------------------------------------------------


def _mutated(kind: str, change) -> list[str]:
    docs = copy.deepcopy(example_docs())
    for _, doc in docs:
        if doc["kind"] == kind:
            change(doc)
            break
    return autoscaling.check(docs)


def _adapter(change):
    def apply(doc: dict[str, Any]) -> None:
        config = yaml.safe_load(doc["data"]["config.yaml"])
        change(config)
        doc["data"]["config.yaml"] = yaml.safe_dump(config)
    return apply


@pytest.mark.parametrize(
    ("kind", "change", "message"),
    [
        ("ScaledObject", lambda d: d["spec"]["triggers"][0]["metadata"].pop("threshold"), "'threshold' is a required"),
        ("ScaledObject", lambda d: d["spec"]["triggers"][0]["metadata"].update(ignoreNullValue="false"),
         "'ignoreNullValue' was unexpected"),
        ("ScaledObject", lambda d: d["spec"]["triggers"][0]["metadata"].update(threshold="80%"), "does not match"),
        ("ScaledObject", lambda d: d["spec"]["triggers"][0]["metadata"].update(
            query='sum(target_engine_model_rank_role:rooflight_saturation:max5m{role="decode"})'),
         "reads target_engine_model_rank_role:rooflight_saturation:max5m, which rules/ does not generate"),
        ("ScaledObject", lambda d: d["spec"]["triggers"][0]["metadata"].update(query="sum(rooflight_saturation_ratio)"),
         "reads no Rooflight recording rule"),
        ("ScaledObject", lambda d: d["spec"]["triggers"][0]["metadata"].update(
            query=d["spec"]["triggers"][0]["metadata"]["query"].replace("saturation_demand", "saturation")),
         "held to 1: a burst behind the wall"),
        ("ScaledObject", lambda d: d["spec"]["triggers"][0]["metadata"].update(
            query=re.sub(r', role="\w+"', "", d["spec"]["triggers"][0]["metadata"]["query"])),
         "reads a per-role record without a role matcher"),
        ("ConfigMap", _adapter(lambda c: c["rules"][0].update(seriesQuerry=c["rules"][0].pop("seriesQuery"))),
         "'seriesQuerry' was unexpected"),
        ("ConfigMap", _adapter(lambda c: c["rules"][0].pop("metricsQuery")), "'metricsQuery' is a required"),
        ("ConfigMap", _adapter(lambda c: c["rules"][0].update(metricsQuery="max(<<.Series>>)")), "does not match"),
        ("ConfigMap", _adapter(lambda c: c["rules"][0]["name"].update(matches="^rooflight_(.*)$")),
         "does not match its series"),
        ("ConfigMap", _adapter(lambda c: c["rules"][1]["name"].update(rename="x")), "'rename' was unexpected"),
        ("ConfigMap", _adapter(lambda c: c["rules"][0].update(metricsQuery="max by (<<.GroupBy>>) (<<.Series>>{<<.LabelMatchers>>})")),
         "reads a per-role record without a role matcher"),
        ("HorizontalPodAutoscaler",
         lambda d: d["spec"]["metrics"][0]["pods"]["metric"].update(name="rooflight_saturation"),
         "rooflight_saturation is served by no prometheus-adapter rule"),
    ],
    ids=["keda-no-threshold", "keda-misspelt-key", "keda-percent", "keda-unknown-record", "keda-raw-metric",
         "keda-capped-saturation", "keda-no-role", "adapter-misspelt-key", "adapter-no-query",
         "adapter-no-matchers", "adapter-name-mismatch", "adapter-unknown-name-key", "adapter-no-role",
         "hpa-unserved-metric"],
)
def test_a_broken_example_is_reported(kind: str, change, message: str) -> None:
    errors = _mutated(kind, change)
    assert any(message in e for e in errors), errors


def test_the_adapter_query_is_rendered_as_the_adapter_renders_it() -> None:
    rule = adapter_rules()["rooflight_decode_saturation_demand"]
    series = autoscaling.SERIES_NAME.match(rule["seriesQuery"]).group(1)
    query = autoscaling.render_metrics_query(rule["metricsQuery"], series, {"LabelMatchers": 'namespace="llm"',
                                                                            "GroupBy": "pod"})
    assert query == f'max by (pod) ({series}{{namespace="llm", role="decode"}})'


# The queries, run by promtool over the generated rules -----------------------------------------------------

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
# docs/deploy.md, section Autoscaling: four decode pods at 0.92, 0.88, 0.95 (the hotter of its two
# data-parallel ranks, 0.95 and 0.70) and 0.85; two prefill pods at 0.78 and 0.66; two aggregated (role
# both) pods at 0.75 and 0.9. Nothing queues, so each demand is its saturation. A staging namespace's pod
# of the same name, and a rank of the other role, must not count.
DECODE = {"llm-decode-7d9f8c-a": [0.92], "llm-decode-7d9f8c-b": [0.88], "llm-decode-7d9f8c-c": [0.95, 0.70],
          "llm-decode-7d9f8c-d": [0.85]}
PREFILL = {"llm-prefill-5b6c7d-a": [0.78], "llm-prefill-5b6c7d-b": [0.66]}
BOTH = {"llm-rooflight-6f5e4d-a": [0.75], "llm-rooflight-6f5e4d-b": [0.9]}
STEADY = {"decode": DECODE, "prefill": PREFILL, "both": BOTH}


def _series(namespace: str, pod: str, rank: int, role: str, values: str, demand: str | None = None) -> list[dict[str, str]]:
    """The agent's 1m-window saturation and saturation demand of one rank (the demand defaults to the
    saturation: nothing queued)."""
    labels = (f'namespace="{namespace}", pod="{pod}", job="rooflight", target="{pod}", engine="vllm", '
              f'model="llama-3.1-70b-instruct", rank="{rank}", role="{role}", window="1m"')
    return [{"series": f"rooflight_saturation_ratio{{{labels}}}", "values": values},
            {"series": f"rooflight_saturation_demand{{{labels}}}", "values": demand or values}]


def _input() -> list[dict[str, str]]:
    out = [s for role, pods in STEADY.items() for pod, values in pods.items() for rank, v in enumerate(values)
           for s in _series("llm", pod, rank, role, f"{v}x20")]
    out += _series("staging", "llm-decode-7d9f8c-a", 0, "decode", "0.99x20")
    out += _series("llm", "llm-decode-7d9f8c-d", 1, "prefill", "0.99x20")  # a rank of the other role
    return out


def _pod_sample(pod: str, value: float) -> dict[str, Any]:
    return {"labels": f'{{pod="{pod}"}}', "value": value}


def _promtool(tmp_path: Path, input_series: list[dict[str, str]], tests: list[dict[str, Any]], interval: str) -> None:
    """Run `tests` with promtool over the generated rules."""
    shutil.copy(OUTPUTS["yaml"], tmp_path / "rules.yaml")
    spec = {"rule_files": ["rules.yaml"], "evaluation_interval": interval,
            "tests": [{"interval": interval, "input_series": input_series, "promql_expr_test": tests}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(spec, width=10_000))
    assert Path(PROMTOOL).exists(), "promtool not found: apt-get install prometheus (Debian) provides it"
    result = subprocess.run([PROMTOOL, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
def test_the_queries_give_the_worked_example(tmp_path: Path) -> None:
    rules = adapter_rules()
    record = autoscaling.SERIES_NAME.match(rules["rooflight_decode_saturation_demand"]["seriesQuery"]).group(1)

    def adapter(name: str, pods: dict[str, list[float]]) -> str:
        request = {"LabelMatchers": f'namespace="llm",pod=~"{"|".join(pods)}"', "GroupBy": "pod"}
        return autoscaling.render_metrics_query(rules[name]["metricsQuery"], record, request)

    sums = {POOLS[role][0]: round(sum(max(v) for v in pods.values()), 6) for role, pods in STEADY.items()}
    tests = [
        {"expr": f"round({trigger(name)['query']}, 0.001)", "eval_time": "5m",
         "exp_samples": [{"labels": "{}", "value": value}]}
        for name, value in sums.items()
    ]
    tests += [
        {"expr": adapter(f"rooflight_{role}_saturation_demand", pods), "eval_time": "5m",
         "exp_samples": [_pod_sample(pod, max(v)) for pod, v in pods.items()]}
        for role, pods in STEADY.items()
    ]
    # The prefill rule asked about the decode pods: only llm-decode-7d9f8c-d's prefill rank answers.
    tests.append({"expr": adapter("rooflight_prefill_saturation_demand", DECODE), "eval_time": "5m",
                  "exp_samples": [_pod_sample("llm-decode-7d9f8c-d", 0.99)]})
    _promtool(tmp_path, _input(), tests, "1m")
    # What each autoscaler then asks for: ceil(sum / threshold), KEDA's and the HPA's arithmetic alike.
    hpas = by_kind("HorizontalPodAutoscaler")
    for name, pods in (("llm-decode", 5), ("llm-prefill", 3), ("llm-rooflight", 3)):
        assert math.ceil(sums[name] / float(trigger(name)["threshold"])) == pods, name
        target = quantity(hpas[name]["spec"]["metrics"][0]["pods"]["target"]["averageValue"])
        assert math.ceil(sums[name] / target) == pods, name
    assert (sums["llm-decode"], sums["llm-prefill"], sums["llm-rooflight"]) == (3.6, 1.44, 1.65)


@pytest.mark.prometheus
@pytest.mark.parametrize("role", list(POOLS))
def test_a_burst_asks_for_its_pods_in_one_step(tmp_path: Path, role: str) -> None:
    # docs/deploy.md, section Autoscaling, a burst: four pods of the pool at their wall (saturation 1), each
    # with 12 running and 25 waiting, 100 queued in all; the agent's demand is 1 x 37 / 12 per pod. The
    # example's own query sums 4 x 37 / 12 = 12.333, and its HPA asks for ceil(12.333 / threshold), held to
    # maxReplicas 16: decode and both ceil(15.4) = 16, prefill ceil(17.6) = 18 -> 16. The same query on the
    # capped saturation record gave 4 / threshold: 5 (or 6 at 0.7), one step of several cold starts.
    name, threshold = POOLS[role]
    pods = [f"{name}-6c5d4e-{c}" for c in "abcd"]
    burst = [s for pod in pods for s in _series("llm", pod, 0, role, "0.7x4 1x6", f"0.7x4 {37 / 12!r}x6")]
    query = trigger(name)["query"]
    capped = query.replace("rooflight_saturation_demand:", "rooflight_saturation:")
    tests = [{"expr": f"round({q}, 0.001)", "eval_time": t, "exp_samples": [{"labels": "{}", "value": v}]}
             for q, t, v in ((query, "3m", 2.8), (query, "6m", 12.333), (capped, "6m", 4.0))]
    _promtool(tmp_path, burst, tests, "1m")
    spec = by_kind("ScaledObject")[name]["spec"]
    hpa = by_kind("HorizontalPodAutoscaler")[name]["spec"]
    target = quantity(hpa["metrics"][0]["pods"]["target"]["averageValue"])
    assert target == float(trigger(name)["threshold"]) == threshold
    wanted = min(math.ceil(12.333 / target), spec["maxReplicaCount"], hpa["maxReplicas"])
    assert wanted == 16
    assert math.ceil(4.0 / target) == {0.8: 5, 0.7: 6}[threshold]  # on the capped saturation
    # and the scale-up behaviour lets 4 pods become 16 within one period: +300% (selectPolicy Max)
    for behavior in (spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"], hpa["behavior"]):
        allowed = max(p["value"] if p["type"] == "Pods" else 4 * p["value"] / 100
                      for p in behavior["scaleUp"]["policies"])
        assert 4 + allowed >= wanted and behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
