"""The generated rules: promtool-clean, unit-tested, complete, fresh, and driven by the config and CLI."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rooflight.agent.metrics import names
from rooflight.agent.errors import ConfigError
from rooflight.rules import config as cfg
from rooflight.rules.generate import OUTPUTS, check, register, run_rules
from rooflight.rules.render import groups, render
from support import ROOT

RULES_DIR = ROOT / "rules"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
CONTRACT = ROOT / "docs" / "metric-contract.md"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def seconds(duration: str) -> float:
    return sum(float(n) * UNIT[u] for n, u in DURATION.findall(duration))


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    assert Path(PROMTOOL).exists(), "promtool not found: apt-get install prometheus (Debian) provides it"
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def checked_in_alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load(OUTPUTS["yaml"].read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def rooflight_rules(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rooflight")
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["rules", *argv])


# promtool -------------------------------------------------------------------------------------------


@pytest.mark.prometheus
def test_promtool_check_rules_is_clean(tmp_path: Path) -> None:
    # The PrometheusRule's spec is a rules file; promtool reads only the bare groups.
    spec = yaml.safe_load(OUTPUTS["prometheusrule"].read_text())["spec"]
    unwrapped = tmp_path / "from-prometheusrule.yaml"
    unwrapped.write_text(yaml.safe_dump(spec))
    result = promtool("check", "rules", str(OUTPUTS["yaml"]), str(unwrapped))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == 2


@pytest.mark.prometheus
def test_promtool_unit_tests_pass() -> None:
    tests = sorted(str(p.relative_to(ROOT)) for p in (RULES_DIR / "tests").glob("*.yaml"))
    assert len(tests) >= 4
    result = promtool("test", "rules", *tests)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout


@pytest.mark.prometheus
def test_whole_number_thresholds_match_python_and_go_spellings_of_le(tmp_path: Path) -> None:
    # Python clients write le="1.0", Go clients and Prometheus 2 scrapes of them le="1": both must count.
    slo = cfg.vllm_ttft(threshold_seconds=1.0)
    (tmp_path / "rules.yaml").write_text(render(cfg.RulesConfig(ttft=slo)))
    (tmp_path / "test.yaml").write_text(
        """
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - {series: 'vllm:time_to_first_token_seconds_count{model_name="py"}', values: '0+100x20'}
      - {series: 'vllm:time_to_first_token_seconds_bucket{model_name="py", le="1.0"}', values: '0+90x20'}
      - {series: 'vllm:time_to_first_token_seconds_count{model_name="go"}', values: '0+100x20'}
      - {series: 'vllm:time_to_first_token_seconds_bucket{model_name="go", le="1"}', values: '0+70x20'}
    promql_expr_test:
      - expr: round(model_name:rooflight_ttft_slo_errors:ratio_rate5m, 0.01)
        eval_time: 10m
        exp_samples:
          - {labels: '{model_name="py"}', value: 0.1}
          - {labels: '{model_name="go"}', value: 0.3}
    alert_rule_test:
      - {eval_time: 20m, alertname: RooflightSLOBucketMissing, exp_alerts: []}
"""
    )
    result = promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# Completeness ---------------------------------------------------------------------------------------


def test_every_contract_alert_is_generated() -> None:
    generated = {r["alert"] for r in checked_in_alerts()}
    assert set(names.ALERTS) <= generated


def test_names_module_matches_the_shared_contract() -> None:
    if not CONTRACT.exists():
        pytest.skip(f"{CONTRACT} is not part of this checkout")
    section = CONTRACT.read_text().split("## Alerts", 1)[1]
    assert set(re.findall(r"`(Rooflight\w+)`", section)) == set(names.ALERTS)


def test_every_alert_has_severity_summary_description_and_runbook() -> None:
    headings = set(re.findall(r"^## (Rooflight\w+)$", RUNBOOKS.read_text(), flags=re.M))
    for rule in checked_in_alerts():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        annotations = rule["annotations"]
        assert annotations["summary"].endswith("."), name
        assert "{{ $labels." in annotations["description"], name
        assert annotations["runbook_url"].endswith(f"#{name.lower()}"), name
        assert name in headings, f"docs/runbooks.md has no section for {name}"


def test_every_alert_has_a_firing_case_and_a_near_miss() -> None:
    min_for: dict[str, float] = {}
    for rule in checked_in_alerts():
        min_for[rule["alert"]] = min(min_for.get(rule["alert"], float("inf")), seconds(rule["for"]))
    fires: set[str] = set()
    misses: set[str] = set()
    for path in (RULES_DIR / "tests").glob("*.yaml"):
        for group in yaml.safe_load(path.read_text())["tests"]:
            assert group["input_series"], path
            for case in group.get("alert_rule_test", []):
                name = case["alertname"]
                if case.get("exp_alerts"):
                    fires.add(name)
                # A near miss is checked after the alert could have fired, not while it is merely pending.
                elif seconds(case["eval_time"]) >= min_for.get(name, 0):
                    misses.add(name)
    assert set(min_for) - fires == set(), "alerts without a firing case"
    assert set(min_for) - misses == set(), "alerts without a near-miss case"


def test_rules_only_read_metrics_the_agent_exports() -> None:
    exported = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str) and v.startswith("rooflight_")}
    text = OUTPUTS["yaml"].read_text()
    read = set(re.findall(r"(?<![:\w])(rooflight_\w+)", "\n".join(re.findall(r"expr: .*|^ {10}.*", text, re.M))))
    assert read, "no rooflight_ metric found in the rules"
    assert read <= exported, f"rules read metrics no module exports: {sorted(read - exported)}"


# Generation -----------------------------------------------------------------------------------------


def test_checked_in_files_are_fresh(capsys: pytest.CaptureFixture[str]) -> None:
    assert check() == 0, capsys.readouterr().out


def test_check_reports_a_stale_file_with_a_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "rules.yaml"
    stale.write_text(render(cfg.RulesConfig()).replace("for: 30m", "for: 1m"))
    assert check({"yaml": stale}) == 1
    out = capsys.readouterr().out
    assert "-        for: 1m" in out and "+        for: 30m" in out


def test_rendering_is_deterministic_and_ordered() -> None:
    config = cfg.RulesConfig()
    assert render(config) == render(config)
    kinds = [g["name"] for g in groups(config)]
    assert kinds == ["rooflight.rules", "rooflight-slo.rules", "rooflight.alerts", "rooflight-slo.alerts"]


def test_prometheusrule_carries_the_same_groups_and_the_release_label() -> None:
    config = cfg.RulesConfig(release="kube-prometheus-stack")
    doc = yaml.safe_load(render(config, "prometheusrule"))
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert doc["spec"]["groups"] == yaml.safe_load(render(config))["groups"]
    assert "release" not in yaml.safe_load(OUTPUTS["prometheusrule"].read_text())["metadata"]["labels"]


# Config and the `rooflight rules` command -----------------------------------------------------------


def test_threshold_off_the_bucket_edges_is_refused_at_build_time() -> None:
    with pytest.raises(ConfigError, match="not a bucket edge"):
        cfg.vllm_ttft(threshold_seconds=2.0)  # vLLM TTFT has 1.0 and 2.5, no 2.0


def test_rooflight_rules_defaults_print_the_checked_in_file(capsys: pytest.CaptureFixture[str]) -> None:
    args = rooflight_rules([])
    assert args.func(args) == 0
    assert capsys.readouterr().out == OUTPUTS["yaml"].read_text()


def test_rooflight_rules_applies_selectors_thresholds_and_format(capsys: pytest.CaptureFixture[str]) -> None:
    args = rooflight_rules(
        [
            "--agent-selector", 'job="rooflight"',
            "--engine-selector", 'namespace="llm"',
            "--ttft-threshold", "1",
            "--itl-threshold", "0.05",
            "--ttft-objective", "0.995",
            "--low-mbu-threshold", "0.4",
            "--extra-labels", "cluster",
            "--format", "prometheusrule",
            "--release", "prom",
        ]
    )  # fmt: skip
    assert run_rules(args) == 0
    text = capsys.readouterr().out
    doc = yaml.safe_load(text)
    assert doc["metadata"]["labels"]["release"] == "prom"
    exprs = "\n".join(r["expr"] for g in doc["spec"]["groups"] for r in g["rules"])
    assert 'rooflight_source_up{job="rooflight", source="engine"} == 0' in exprs
    assert 'vllm:time_to_first_token_seconds_bucket{namespace="llm", le=~"1(\\\\.0)?"}' in exprs
    assert 'vllm:inter_token_latency_seconds_bucket{namespace="llm", le="0.05"}' in exprs
    assert "model_name:rooflight_ttft_slo_errors:ratio_rate1h > 0.072" in exprs  # 14.4 x 0.005
    # Topology labels are kept in every join but never named in the rule: names stay what dashboards read.
    assert "target_engine_model_rank:rooflight_mbu:ratio_rate5m < 0.4" in exprs
    assert "on (cluster, namespace, pod, instance, job, target, model) group_left" in exprs


def test_rooflight_rules_for_sglang_uses_its_histograms(capsys: pytest.CaptureFixture[str]) -> None:
    args = rooflight_rules(["--engine", "sglang"])
    assert run_rules(args) == 0
    text = capsys.readouterr().out
    assert 'sglang:time_to_first_token_seconds_bucket{le=~"2(\\\\.0)?"}' in text
    assert "vllm:" not in text


def test_rooflight_rules_reports_a_bad_threshold_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    args = rooflight_rules(["--ttft-threshold", "2"])
    assert run_rules(args) == 2
    err = capsys.readouterr().err
    assert "not a bucket edge" in err and "--custom-histogram-buckets" in err


def test_declared_custom_buckets_allow_the_threshold(tmp_path: Path) -> None:
    out = tmp_path / "rules.yaml"
    args = rooflight_rules(["--ttft-threshold", "2", "--ttft-buckets", "0.5,1,2,5", "-o", str(out)])
    assert run_rules(args) == 0
    assert 'le=~"2(\\\\.0)?"' in out.read_text()


@pytest.mark.parametrize(
    "bad",
    [
        {"rate_window": "5 minutes"},
        {"low_mbu_threshold": 1.5},
        {"slo_group_by": ()},
        {"extra_labels": ("not-a-label",)},
        {"topology_labels": ("cluster", "pod-name")},
        {"extra_labels": ("model",)},  # the agent's own label: a scrape label must not shadow it
        {"topology_labels": ("target",)},
        {"rule_name": "Rooflight_Rules"},
        {"burn_windows": ()},
    ],
)
def test_inconsistent_config_is_a_config_error(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        cfg.RulesConfig(**bad)


def test_inconsistent_alert_parts_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        cfg.DetectorAlert("10m", 0.0, "5m")
    with pytest.raises(ConfigError):
        cfg.BurnWindow("1h", "5m", 14.4, "2m", "page")  # severity is critical/warning/info
    with pytest.raises(ConfigError):
        cfg.vllm_itl(objective=1.0)


# Topology labels: replicas, namespaces and clusters never mix -----------------------------------------

CLAUSE = re.compile(r"\b(by|on) \(([^)]*)\)")
FLEET = ("model:", "model_phase:")


def clauses(expr: str) -> list[tuple[str, tuple[str, ...]]]:
    """Every by()/on() clause of a PromQL expression, as (keyword, labels)."""
    return [(kw, tuple(x.strip() for x in inner.split(",") if x.strip())) for kw, inner in CLAUSE.findall(expr)]


@pytest.mark.parametrize(
    "config",
    [
        cfg.RulesConfig(),
        cfg.RulesConfig(topology_labels=("tenant", "pod"), replica_labels=("pod",), extra_labels=("region",)),
    ],
    ids=["default", "custom"],
)
def test_every_per_target_clause_keeps_the_topology_labels(config: cfg.RulesConfig) -> None:
    kept = config.kept_labels
    checked = 0
    for group in groups(config):
        for rule in group["rules"]:
            name = rule.get("record") or rule["alert"]
            for kw, names_ in clauses(rule["expr"]):
                checked += 1
                if name.startswith(FLEET):
                    # Fleet level on purpose: by model (and phase), nothing else.
                    assert names_ in (("model",), ("model", "phase")), (name, kw, names_)
                elif "-slo." in group["name"]:
                    # An SLO sums over the replicas and keeps where the service runs.
                    assert names_ == (*config.service_labels, *config.slo_group_by), (name, kw, names_)
                else:
                    assert names_[: len(kept)] == kept, (name, kw, names_)
    assert checked > 40


def test_slo_labels_leave_out_only_the_replicas() -> None:
    default = cfg.RulesConfig()
    assert default.kept_labels == ("cluster", "namespace", "pod", "instance", "job")
    assert default.service_labels == ("cluster", "namespace", "job")
    custom = cfg.RulesConfig(topology_labels=("cluster", "instance"), replica_labels=("instance",),
                             extra_labels=("region", "cluster"))
    assert custom.kept_labels == ("cluster", "instance", "region")  # in order, without repeats
    assert custom.service_labels == ("cluster", "region")


def test_rule_names_do_not_change_with_the_topology_labels() -> None:
    def names_of(config: cfg.RulesConfig) -> list[str]:
        return [r.get("record") or r["alert"] for g in groups(config) for r in g["rules"]]

    bare = cfg.RulesConfig(topology_labels=(), replica_labels=())
    assert names_of(cfg.RulesConfig()) == names_of(bare) == names_of(cfg.RulesConfig(extra_labels=("region",)))
    assert "by (target, engine, model, rank)" in render(bare)
    assert "cluster" not in render(bare)


def test_rooflight_rules_topology_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = rooflight_rules(["--topology-labels", "namespace,pod", "--replica-labels", "pod", "--extra-labels", "region"])
    assert run_rules(args) == 0
    text = capsys.readouterr().out
    assert "sum by (namespace, pod, region, target, engine, model, rank)" in text
    assert "sum by (namespace, region, model_name)" in text
    assert "cluster" not in text
    args = rooflight_rules(["--topology-labels", ""])
    assert run_rules(args) == 0
    assert "sum by (target, engine, model, rank)" in capsys.readouterr().out


def test_rooflight_rules_refuses_a_bad_topology_label(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_rules(rooflight_rules(["--topology-labels", "cluster,k8s-pod"])) == 2
    assert "'k8s-pod' is not a Prometheus label name" in capsys.readouterr().err
    assert run_rules(rooflight_rules(["--extra-labels", "rank"])) == 2
    assert "the agent's own label" in capsys.readouterr().err


def test_per_target_alert_descriptions_name_the_replica() -> None:
    doc = yaml.safe_load(OUTPUTS["yaml"].read_text())
    alerts = [r for g in doc["groups"] if g["name"] == "rooflight.alerts" for r in g["rules"]]
    assert len(alerts) == 6
    for rule in alerts:
        description = rule["annotations"]["description"]
        assert "{{ if $labels.pod }}" in description and "{{ else if $labels.instance }}" in description, rule["alert"]
