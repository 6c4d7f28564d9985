"""The generated rules: promtool-clean, unit-tested, complete, fresh, and driven by the config and CLI."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rooflight.agent.metrics import catalog, names
from rooflight.agent.signals.detectors import detectors
from rooflight.agent.proxy import catalog as proxy_catalog
from rooflight.agent.errors import ConfigError
from rooflight.collectors.nvml import GPU_EXTRA_METRICS
from rooflight.rules import config as cfg
from rooflight.rules.generate import OUTPUTS, check, register, run_rules
from rooflight.rules import templates
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


def exprs(text: str) -> str:
    """Every rule's expr of a rendered rules file, one after the other."""
    return "\n".join(r["expr"] for g in yaml.safe_load(text)["groups"] for r in g["rules"])


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


PROMTOOL_TESTS = sorted(p.name for p in (RULES_DIR / "tests").glob("*.yaml"))


def test_the_promtool_unit_tests_are_found() -> None:
    assert len(PROMTOOL_TESTS) >= 4


@pytest.mark.prometheus
@pytest.mark.parametrize("test_file", PROMTOOL_TESTS)
def test_promtool_unit_tests_pass(test_file: str) -> None:
    """One promtool run per file: the slowest take 20-40 s each, and pytest-xdist spreads them over its workers."""
    result = promtool("test", "rules", str((RULES_DIR / "tests" / test_file).relative_to(ROOT)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout and "SUCCESS" in result.stdout


@pytest.mark.prometheus
def test_whole_number_thresholds_match_python_and_go_spellings_of_le(tmp_path: Path) -> None:
    # Python clients write le="1.0", Go clients and Prometheus 2 scrapes of them le="1": both must count.
    slo = cfg.ttft_slo(threshold_seconds=1.0)
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


def test_names_module_matches_the_contract_and_the_shipped_alerts() -> None:
    section = CONTRACT.read_text().split("## Alerts", 1)[1]
    assert set(re.findall(r"`(Rooflight\w+)`", section)) == set(names.ALERTS)
    assert {rule["alert"] for rule in checked_in_alerts()} == set(names.ALERTS)


def test_every_alert_has_severity_summary_description_and_runbook() -> None:
    headings = set(re.findall(r"^## (Rooflight\w+)$", RUNBOOKS.read_text(), flags=re.M))
    for rule in checked_in_alerts():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url", "dashboard_url"}, name
        assert annotations["summary"].endswith("."), name
        if name != "RooflightAgentAbsent":  # absent() has no series, so no labels to name
            assert "{{ $labels." in annotations["description"], name
        assert annotations["runbook_url"].endswith(f"#{name.lower()}"), name
        assert name in headings, f"docs/runbooks.md has no section for {name}"


def _dashboard_variables() -> dict[str, set[str]]:
    """uid -> the variable names of each generated dashboard."""
    out = {}
    for path in (ROOT / "dashboards" / "json").glob("*.json"):
        doc = json.loads(path.read_text())
        out[doc["uid"]] = {v["name"] for v in doc["templating"]["list"]}
    return out


def test_every_dashboard_url_opens_a_real_dashboard_with_its_variables() -> None:
    from rooflight.dashboards import gpu, kvbatch, overview, roofline

    assert set(cfg.DASHBOARD_UIDS.values()) == {gpu.UID, kvbatch.UID, overview.UID, roofline.UID}
    boards = _dashboard_variables()
    base = cfg.RulesConfig().dashboard_base_url
    for rule in checked_in_alerts():
        url = rule["annotations"]["dashboard_url"]
        uid = re.match(re.escape(base) + r"/d/([\w-]+)\?from=now-3h&to=now", url)
        assert uid and uid.group(1) in boards, (rule["alert"], url)
        variables = re.findall(r"&var-(\w+)=\{\{ \$labels\.(\w+) \| urlquery \}\}", url)
        assert variables, rule["alert"]
        for var, label in variables:
            assert var in boards[uid.group(1)], (rule["alert"], var)
            assert f"{{{{ if $labels.{label} }}}}&var-{var}=" in url, "an absent label must leave the variable at All"
        if rule["alert"] in ("RooflightHeadOfLineBlocking", "RooflightBatchCapacityCapped", "RooflightLowDecodeMBU"):
            assert [v for v, _ in variables] == list(cfg.DASHBOARD_VARIABLES), rule["alert"]
        if rule["alert"] == "RooflightGoodputBudgetBurn":
            # The proxy's counters are the agent's own series: its job, pod and target select them.
            assert [v for v, _ in variables] == ["cluster", "namespace", "job", "pod", "instance", "target"]
        elif "-slo" in url or rule["alert"].endswith(("BudgetBurn", "BucketMissing")):
            # An SLO's `job` is the engine's scrape, not the agent's the dashboards select by.
            assert ("job", "job") not in variables and ("model", "model_name") in variables


def test_template_queries_name_the_alerts_own_series() -> None:
    # Every query an annotation runs is narrowed by all of the alert's labels ($self), never unfiltered.
    queried = 0
    for rule in checked_in_alerts():
        description = rule["annotations"]["description"]
        for query in re.findall(r'\{\{ with printf "([^"]*)"', description):
            queried += 1
            selectors = re.findall(r"(rooflight_\w+|vllm:\w+|sglang:\w+)\{([^}]*)\}", query)
            assert selectors and all(inner.startswith("%[1]s") for _, inner in selectors), (rule["alert"], query)
            assert description.startswith(templates.SELF), rule["alert"]
    assert queried >= 10


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
    exported = {f.name for f in catalog.families()}  # every family the agent declares, detectors and NVML's included
    exported |= {d.name for d in proxy_catalog.CATALOG}  # the client-side proxy's, on the same /metrics under `run`
    assert {f"{names.PREFIX}gpu_{key}" for key in GPU_EXTRA_METRICS} <= exported  # the NVML collector's per-GPU series
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
    assert kinds == [
        "rooflight.rules", "rooflight-slo.rules", "rooflight-goodput.rules", "rooflight-capacity.rules",
        "rooflight.alerts", "rooflight-outage.alerts", "rooflight-health.alerts", "rooflight-slo.alerts",
        "rooflight-goodput.alerts", "rooflight-meta.alerts",
    ]


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
        cfg.ttft_slo(threshold_seconds=2.0)  # vLLM TTFT has 1.0 and 2.5, no 2.0


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
    assert 'rooflight_source_up{job="rooflight", source="engine"} == bool 0' in exprs
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
        {"extra_labels": ("slo",)},  # the proxy's SLO label: each SLO has its own goodput budget
        {"goodput_objective": 1.0},
        {"goodput_objective": 0.0},
        {"rule_name": "Rooflight_Rules"},
        {"burn_windows": ()},
        {"saturation_window": "1m30s"},  # names a record: one number, one unit, as the agent's windows are
        {"capacity_window": "5 minutes"},
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
        cfg.itl_slo(objective=1.0)


# Topology labels: replicas, namespaces and clusters never mix -----------------------------------------

CLAUSE = re.compile(r"\b(by|on) \(([^)]*)\)")
FLEET = ("model:", "model_phase:", "model_role:")
FLEET_LEVELS = (("model",), ("model", "phase"), ("model", "role"))


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
                    # Fleet level on purpose: by model (and phase, or role), nothing else; below its
                    # aggregation a fleet rule may join per rank (the priced ranks' tokens), or per rank and
                    # phase (each rank's share of GPU time by phase), on every label.
                    rank = (*kept, "target", "engine", "model", "rank")
                    per_rank_join = kw == "on" and names_ in (rank, (*rank, "phase"))
                    fleet_levels = [(*config.service_labels, *level) for level in FLEET_LEVELS]
                    assert per_rank_join or names_ in fleet_levels, (name, kw, names_)
                elif "-slo." in group["name"]:
                    # An SLO sums over the replicas and keeps where the service runs. Below its sum, the clients'
                    # SLO joins each pod (the engine's HTTP counters) or agent target (the proxy's) to its model,
                    # and takes the proxy's or the engine's per model where it runs (its scope: no scrape job).
                    service = (*config.service_labels, *config.slo_group_by)
                    scope = (*(x for x in config.service_labels if x not in ("job", "instance")), *config.slo_group_by)
                    below = (kept, (*kept, "target"), (*kept, *config.slo_group_by))
                    assert names_ == service or names_ in below or (kw == "on" and names_ == scope), (name, kw, names_)
                elif name == "RooflightModelDown":
                    # A model's share of its engines down: its pods summed, within its service scope.
                    assert names_ == (*config.service_labels, "model"), (name, kw, names_)
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
    assert "cluster" not in exprs(render(bare))


def test_rooflight_rules_topology_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = rooflight_rules(["--topology-labels", "namespace,pod", "--replica-labels", "pod", "--extra-labels", "region"])
    assert run_rules(args) == 0
    text = capsys.readouterr().out
    assert "sum by (namespace, pod, region, target, engine, model, rank)" in text
    assert "sum by (namespace, region, model_name)" in text
    assert "cluster" not in exprs(text)  # (dashboard links still set var-cluster where an alert has one)
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
    alerts = [r for g in doc["groups"] if g["name"] in ("rooflight.alerts", "rooflight-outage.alerts")
              for r in g["rules"] if "alert" in r and r["alert"] != "RooflightModelDown"]  # a model's: it names its pods
    assert len(alerts) == len([d for d in detectors() if d.rule is not None]) + 5  # + low MBU, GPU and
    # other sources down, engine down, engine start timeout
    for rule in alerts:
        description = rule["annotations"]["description"]
        assert "{{ if $labels.pod }}" in description and "{{ else if $labels.instance }}" in description, rule["alert"]


# Per-model SLO thresholds ------------------------------------------------------------------------------

PER_MODEL = ["--ttft-threshold-for", "llama-70b=5", "--ttft-threshold-for", "qwen-72b=5",
             "--ttft-threshold-for", "custom-70b=5"]


@pytest.mark.prometheus
def test_per_model_thresholds_page_each_model_at_its_own_threshold(tmp_path: Path) -> None:
    args = rooflight_rules([*PER_MODEL, "-o", str(tmp_path / "rules.yaml")])
    assert run_rules(args) == 0
    shutil.copy(ROOT / "tests" / "rules" / "per_model_slo_test.yaml", tmp_path)
    result = promtool("test", "rules", "per_model_slo_test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert promtool("check", "rules", "rules.yaml", cwd=tmp_path).returncode == 0


def test_per_model_thresholds_add_lines_and_leave_the_default_rendering_alone() -> None:
    slo = cfg.ttft_slo(by_model=(("qwen-72b", 5.0), ("llama-70b", 10.0)))
    assert slo.by_model == (("llama-70b", 10.0), ("qwen-72b", 5.0))  # sorted, as Helm ranges over a map
    text = render(cfg.RulesConfig(ttft=slo))
    assert 'model_name!="llama-70b", model_name!="qwen-72b"' in text
    assert 'vllm:time_to_first_token_seconds_bucket{model_name="llama-70b", le=~"10(\\\\.0)?"}' in text
    burn = next(r for g in groups(cfg.RulesConfig(ttft=slo)) for r in g["rules"] if r.get("alert") == slo.alert)
    chain = '{{ if eq $labels.model_name "llama-70b" }}10{{ else }}{{ if eq $labels.model_name "qwen-72b" }}5'
    assert f"exceeded {chain}{{{{ else }}}}2.5{{{{ end }}}}{{{{ end }}}}s" in burn["annotations"]["description"]
    plain = render(cfg.RulesConfig())
    assert "model_name!=" not in plain and "{{ if eq $labels.model_name" not in plain
    # The ITL SLO, without overrides, renders exactly as without any override anywhere.
    itl = [g for g in groups(cfg.RulesConfig(ttft=slo)) if g["name"] == "rooflight-slo.rules"][0]["rules"]
    assert [r for r in itl if "itl" in r["record"]] == [
        r for r in groups(cfg.RulesConfig())[1]["rules"] if "itl" in r["record"]
    ]


@pytest.mark.parametrize(
    "by_model",
    [
        (("llama-70b", 2.0),),  # not a vLLM TTFT edge
        (("llama-70b", 5.0), ("llama-70b", 10.0)),  # two thresholds for one model
        (('bad"name', 5.0),),
        (("", 5.0),),
    ],
)
def test_bad_per_model_thresholds_are_config_errors(by_model: tuple[tuple[str, float], ...]) -> None:
    with pytest.raises(ConfigError):
        cfg.ttft_slo(by_model=by_model)


def test_per_model_thresholds_need_the_model_label_in_the_slo_grouping() -> None:
    with pytest.raises(ConfigError, match="slo_group_by"):
        cfg.RulesConfig(ttft=cfg.ttft_slo(by_model=(("m", 5.0),)), slo_group_by=("tenant",))


def test_rooflight_rules_reports_a_malformed_per_model_threshold(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_rules(rooflight_rules(["--ttft-threshold-for", "llama-70b"])) == 2
    assert "MODEL=SECONDS" in capsys.readouterr().err
    assert run_rules(rooflight_rules(["--itl-threshold-for", "llama-70b=0.11"])) == 2
    assert "not a bucket edge" in capsys.readouterr().err


# Meta-monitoring and links ------------------------------------------------------------------------------


def test_rooflight_rules_meta_and_url_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = rooflight_rules([
        "--agent-job-selector", 'job="llm-agents"', "--agent-down-for", "7m", "--source-down-for", "20m",
        "--dashboard-base-url", "https://grafana.example.com/grafana",
        "--runbook-base-url", "https://wiki.example.com/rooflight",
    ])  # fmt: skip
    assert run_rules(args) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    alerts = {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}
    assert alerts["RooflightAgentDown"]["expr"] == 'up{job="llm-agents"} == 0'
    assert alerts["RooflightAgentDown"]["for"] == "7m"
    assert alerts["RooflightAgentAbsent"]["expr"] == 'absent(up{job="llm-agents"})'
    assert alerts["RooflightSourceDown"]["for"] == "20m"
    for rule in alerts.values():
        assert rule["annotations"]["dashboard_url"].startswith("https://grafana.example.com/grafana/d/rooflight-")
        assert rule["annotations"]["runbook_url"].startswith("https://wiki.example.com/rooflight#rooflight")


@pytest.mark.parametrize(
    "bad",
    [
        {"dashboard_base_url": "https://grafana.example.com/"},  # a trailing slash doubles in /d/<uid>
        {"dashboard_base_url": "grafana.example.com"},
        {"runbook_base_url": "https://wiki/{{ $labels.pod }}"},
        {"agent_job_selector": ""},
        {"agent_job_selector": "rooflight"},
        {"agent_down_for": "5 minutes"},
        {"itl_short_window": "ten"},
    ],
)
def test_bad_meta_and_url_settings_are_config_errors(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        cfg.RulesConfig(**bad)


# Client-side goodput SLOs ------------------------------------------------------------------------------


def _goodput(config: cfg.RulesConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The goodput SLO's rules (the goodput groups also hold the client availability SLO's)."""
    by_name = {g["name"]: g["rules"] for g in groups(config)}
    records = [r for r in by_name[f"{config.rule_name}-goodput.rules"] if "client_slo_errors" in r["record"]]
    alerts = [r for r in by_name[f"{config.rule_name}-goodput.alerts"] if r["alert"] == "RooflightGoodputBudgetBurn"]
    return records, alerts


def test_goodput_burns_on_the_proxys_judged_and_good_counters_per_replica_and_slo() -> None:
    config = cfg.RulesConfig()
    records, alerts = _goodput(config)
    windows = {w for row in config.burn_windows for w in (row.long, row.short)}
    assert {r["record"] for r in records} == {f"target_slo:rooflight_client_slo_errors:ratio_rate{w}" for w in windows}
    for rule in records:
        assert proxy_catalog.SLO_REQUESTS in rule["expr"] and proxy_catalog.SLO_GOOD in rule["expr"]
        # Replicas stay apart (the client series name no service), each SLO has its own budget, tenants are summed.
        assert {names_ for _, names_ in clauses(rule["expr"])} == {(*config.kept_labels, "target", "slo")}
    assert [(a["labels"]["severity"], a["labels"]["long"], a["labels"]["short"], a["for"]) for a in alerts] == [
        (row.severity, row.long, row.short, row.for_) for row in config.burn_windows]
    assert {a["alert"] for a in alerts} == {"RooflightGoodputBudgetBurn"}
    assert "ratio_rate5m > 0.144\n" in alerts[0]["expr"]  # 14.4 x (1 - 0.99)
    assert f"[1h])) >= {config.slo_min_requests}\n" in alerts[0]["expr"]  # a sample in the long window
    assert alerts[0]["expr"].endswith(f") >= {config.slo_min_bad_events}")  # and bad events in it
    for rule in alerts:
        description = rule["annotations"]["description"]
        assert "{{ if $labels.pod }}" in description and "{{ else if $labels.instance }}" in description
        assert "{{ $labels.slo }}" in description


def test_rooflight_rules_goodput_objective(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_rules(rooflight_rules(["--goodput-objective", "0.9"])) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    burn = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == "RooflightGoodputBudgetBurn"]
    assert [re.findall(r"ratio_rate\w+ > ([0-9.]+)", r["expr"])[-1] for r in burn] == ["1.44", "0.6", "0.3", "0.1"]
    assert "objective: 90% meeting every target" in burn[0]["annotations"]["description"]
    assert run_rules(rooflight_rules(["--goodput-objective", "1"])) == 2
    assert "goodput_objective must be in (0, 1)" in capsys.readouterr().err


def test_goodput_rules_follow_the_selector_and_topology_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = rooflight_rules(["--agent-selector", 'job="rooflight"', "--topology-labels", "namespace,pod",
                            "--replica-labels", "pod"])
    assert run_rules(args) == 0
    text = capsys.readouterr().out
    assert ('sum by (namespace, pod, target, slo) (rate(rooflight_client_slo_good_requests_total{job="rooflight"}[1h]))'
            in text)


# Capacity: the autoscaling signal, groups needed, fleet cost ---------------------------------------------


def _capacity(config: cfg.RulesConfig) -> dict[str, str]:
    """record name -> expr of the capacity group."""
    by_name = {g["name"]: g["rules"] for g in groups(config)}
    return {r["record"]: r["expr"] for r in by_name[f"{config.rule_name}-capacity.rules"]}


def test_capacity_records_read_the_agents_windows_and_keep_the_replica() -> None:
    config = cfg.RulesConfig()
    rules = _capacity(config)
    assert list(rules) == [
        "target_engine_model_rank_role:rooflight_saturation:max1m", "model_role:rooflight_saturation:avg1m",
        "model_role:rooflight_saturation:max1m", "target_engine_model_rank_role:rooflight_saturation_demand:max1m",
        "model_role:rooflight_saturation_demand:avg1m", "model_role:rooflight_saturation_demand:sum1m",
        "model_phase:rooflight_groups_needed:rate5m",
        "target_engine_model_rank:rooflight_gpu_hour_cost:sum", "model:rooflight_gpu_hour_cost:sum",
        "model_phase:rooflight_cost_per_million_tokens:rate5m",
    ]  # fmt: skip
    signal = rules["target_engine_model_rank_role:rooflight_saturation:max1m"]
    assert f'max_over_time({names.SATURATION}{{window="1m"}}[1m])' in signal
    assert clauses(signal) == [("by", (*config.kept_labels, "target", "engine", "model", "rank", "role"))]
    # The burst signal: the same per-rank level, and the pool's records within one service scope.
    demand = rules["target_engine_model_rank_role:rooflight_saturation_demand:max1m"]
    assert f'max_over_time({names.SATURATION_DEMAND}{{window="1m"}}[1m])' in demand
    assert clauses(demand) == clauses(signal)
    for how in ("avg", "sum"):
        pool = rules[f"model_role:rooflight_saturation_demand:{how}1m"]
        assert clauses(pool) == [("by", (*config.service_labels, "model", "role"))], pool
    assert f'{names.CAPACITY_PHASE_TOKENS}{{window="5m"}} > 0' in rules["model_phase:rooflight_groups_needed:rate5m"]
    cost = rules["model_phase:rooflight_cost_per_million_tokens:rate5m"]
    assert "and on (cluster, namespace, pod, instance, job, target, engine, model, rank)" in cost
    assert cost.startswith("1e6 / 3600\n")


def test_capacity_windows_and_selector_follow_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = rooflight_rules(["--saturation-window", "10s", "--capacity-window", "1m",
                            "--agent-selector", 'job="rooflight"'])
    assert run_rules(args) == 0
    text = capsys.readouterr().out
    assert "record: target_engine_model_rank_role:rooflight_saturation:max10s" in text
    assert 'max_over_time(rooflight_saturation_ratio{job="rooflight", window="10s"}[10s])' in text
    assert "avg by (cluster, namespace, job, model, role) (target_engine_model_rank_role:rooflight_saturation:max10s)" in text
    assert 'max_over_time(rooflight_saturation_demand{job="rooflight", window="10s"}[10s])' in text
    assert "sum by (cluster, namespace, job, model, role) (target_engine_model_rank_role:rooflight_saturation_demand:max10s)" in text
    assert 'rooflight_capacity_phase_tokens_per_second{job="rooflight", window="1m"} > 0' in text
    assert 'max by (cluster, namespace, pod, instance, job, target) (rooflight_gpu_hour_cost{job="rooflight"})' in text
    assert run_rules(rooflight_rules(["--saturation-window", "1m30s"])) == 2
    assert "saturation_window" in capsys.readouterr().err



def test_health_thresholds_follow_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = rooflight_rules(["--engine-stalled-for", "3m", "--gpu-temperature-threshold", "80",
                            "--gpu-throttle-share", "0.5"])
    assert run_rules(args) == 0
    alerts = {r["alert"]: r for g in yaml.safe_load(capsys.readouterr().out)["groups"] for r in g["rules"]
              if "alert" in r}
    assert alerts["RooflightEngineStalled"]["for"] == "3m"
    assert alerts["RooflightGPUHot"]["expr"].endswith(">= 80")
    assert alerts["RooflightGPUThrottled"]["expr"].endswith(">= 0.5")
    assert run_rules(rooflight_rules(["--gpu-throttle-share", "0"])) == 2
    assert "gpu_throttle_share" in capsys.readouterr().err
