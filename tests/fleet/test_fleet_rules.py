"""The fleet split of the rules (rules/fleet.py) and what a central ruler needs of them: the two halves add up
to the whole, each rule is where its labels say, `cluster` is in every fleet `by`, and vmalert and
VictoriaMetrics take every expression and template query as Prometheus does."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

import fleetstack as fs
from demo_procs import rooflight_command
from fleetstack import STAGE_CONFIG
from rooflight.agent.errors import ConfigError
from rooflight.rules import fleet
from rooflight.rules.config import RulesConfig, ttft_slo
from rooflight.rules.generate import OUTPUTS, SPLIT_OUTPUTS
from rooflight.rules.render import groups, render
from support import ROOT

RUNBOOKS = ROOT / "docs" / "runbooks.md"
CONFIGS = {
    "default": RulesConfig(),
    "stage": STAGE_CONFIG,
    # a deployment that names its clusters otherwise and keeps a region: the split follows the labels
    "custom": replace(RulesConfig(), topology_labels=("k8s_cluster", "namespace", "pod", "instance", "job"),
                      extra_labels=("region",), cluster_label="k8s_cluster", ttft=ttft_slo(by_model=(("big", 5.0),))),
}
_LISTS = re.compile(r"\b(by|on)\s*\(([^)]*)\)")


def rules_of(config: RulesConfig, scope: str) -> list[dict[str, Any]]:
    return [rule for group in groups(config, scope) for rule in group["rules"]]


def name(rule: dict[str, Any]) -> str:
    return str(rule.get("record") or rule.get("alert"))


def level(record: str) -> list[str]:
    return record.split(":", 1)[0].split("_")


@pytest.mark.parametrize("which", sorted(CONFIGS))
def test_the_halves_add_up_to_the_whole(which: str) -> None:
    config = CONFIGS[which]
    whole = Counter(yaml.safe_dump(r) for r in rules_of(config, "all"))
    pod, fleet_half = rules_of(config, "pod"), rules_of(config, "fleet")
    meta = [r for r in fleet_half if r.get("alert") == fleet.CLUSTER_ALERT]
    assert len(meta) == 1 and fleet.CLUSTER_ALERT not in {name(r) for r in rules_of(config, "all")}
    assert Counter(yaml.safe_dump(r) for r in pod + fleet_half if r not in meta) == whole
    # group for group: the pod half keeps the groups' names, the fleet half is named apart (Mimir keeps both)
    all_names = [g["name"] for g in groups(config)]
    pod_names = [g["name"] for g in groups(config, "pod")]
    fleet_names = [g["name"] for g in groups(config, "fleet")]
    assert pod_names == [n for n in all_names if n in pod_names]
    assert all(n.startswith(f"{config.rule_name}-fleet") for n in fleet_names)
    assert not set(pod_names) & set(fleet_names)


@pytest.mark.parametrize("which", sorted(CONFIGS))
def test_each_rule_is_where_its_labels_say(which: str) -> None:
    config = CONFIGS[which]
    pod, fleet_half = rules_of(config, "pod"), rules_of(config, "fleet")
    # a record's level names `target` exactly when it keeps each engine apart (the names' convention)
    assert all("target" in level(r["record"]) for r in pod if "record" in r)
    assert all("target" not in level(r["record"]) for r in fleet_half if "record" in r)
    assert {name(r) for r in fleet_half if "record" in r} >= {
        "model_phase:rooflight_tokens:rate5m", "model:rooflight_mbu:ratio_rate5m", "model_role:rooflight_saturation:max1m",
        "model:rooflight_gpu_hour_cost:sum", "model_name:rooflight_ttft_slo_errors:ratio_rate5m"}
    assert {"RooflightTTFTBudgetBurn", "RooflightSLOBucketMissing", "RooflightRequestErrorBudgetBurn"} <= {
        name(r) for r in fleet_half}
    assert {"RooflightEngineDown", "RooflightHeadOfLineBlocking", "RooflightAgentDown", "RooflightGoodputBudgetBurn"} <= {
        name(r) for r in pod}
    # a cluster's Prometheus never needs what only the central ruler records
    fleet_records = {r["record"] for r in fleet_half if "record" in r}
    for rule in pod:
        assert not any(re.search(rf"(?<![\w:]){re.escape(rec)}(?![\w:])", rule["expr"]) for rec in fleet_records), name(rule)


@pytest.mark.parametrize("which", sorted(CONFIGS))
def test_every_fleet_by_and_on_keeps_the_cluster(which: str) -> None:
    config = CONFIGS[which]
    checked = 0
    for rule in rules_of(config, "fleet"):
        for keyword, inner in _LISTS.findall(rule["expr"]):
            assert config.cluster_label in {x.strip() for x in inner.split(",")}, (name(rule), keyword, inner)
            checked += 1
    assert checked > 50


def test_the_cluster_label_must_be_a_service_label() -> None:
    with pytest.raises(ConfigError, match="cluster_label 'pod'"):
        render(replace(RulesConfig(), cluster_label="pod"), "yaml", "fleet")
    with pytest.raises(ConfigError, match="cluster_absent_for"):
        RulesConfig(cluster_absent_for="ten minutes")
    with pytest.raises(ConfigError, match="scope"):
        render(RulesConfig(), "yaml", "central")


def test_the_cli_prints_each_half_and_refuses_both_at_once() -> None:
    exe = rooflight_command()  # the installed console script, as a user runs it
    for scope, path in SPLIT_OUTPUTS.items():
        out = subprocess.run([*exe, "rules", f"--{scope}"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout == path.read_text(), f"rules/{path.name} differs from `rooflight rules --{scope}`"
    both = subprocess.run([*exe, "rules", "--pod", "--fleet"], capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and "not allowed with" in both.stderr
    bad = subprocess.run([*exe, "rules", "--fleet", "--cluster-label", "pod"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "cluster_label 'pod'" in bad.stderr and bad.stdout == ""
    short = subprocess.run([*exe, "rules", "--fleet", "--cluster-absent-for", "2m", "--format", "prometheusrule"],
                           capture_output=True, text=True, timeout=60)
    assert short.returncode == 0 and "max_over_time(up{job=\"rooflight\"}[2m])" in short.stdout
    assert "kind: PrometheusRule" in short.stdout


def test_the_fleet_alerts_have_their_annotations_and_runbook() -> None:
    headings = set(re.findall(r"^## (Rooflight\w+)$", RUNBOOKS.read_text(), flags=re.M))
    doc = yaml.safe_load(SPLIT_OUTPUTS["fleet"].read_text())
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert fleet.CLUSTER_ALERT in {a["alert"] for a in alerts}
    for rule in alerts:
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url", "dashboard_url"}
        assert rule["alert"] in headings, f"docs/runbooks.md has no section for {rule['alert']}"


@pytest.mark.prometheus
def test_promtool_checks_the_halves() -> None:
    result = subprocess.run(["promtool", "check", "rules", *map(str, SPLIT_OUTPUTS.values())],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.count("SUCCESS") == 2, result.stdout + result.stderr


# vmalert and VictoriaMetrics ------------------------------------------------------------------------


VMALERT = replace(RulesConfig(), keep_firing_for="")  # Debian 12's vmalert (1.79) has no keep_firing_for


def _without_hold(text: str) -> str:
    return re.sub(r"^ +keep_firing_for: \S+\n", "", text, flags=re.M)


def _rule_files(folder: Path) -> list[Path]:
    """Every rules file a ruler is given, as vmalert is given it (`rooflight rules --keep-firing-for ''`): the
    checked-in ones, the PrometheusRule's groups, the stage's."""
    files = []
    for scope, path in (("all", OUTPUTS["yaml"]), *SPLIT_OUTPUTS.items()):
        files.append(folder / f"vm-{path.name}")
        files[-1].write_text(render(VMALERT, "yaml", scope))
        # the checked-in file is this one and its keep_firing_for lines, nothing else
        assert _without_hold(path.read_text()) == files[-1].read_text(), path
    spec = folder / "prometheusrule-groups.yaml"
    spec.write_text(yaml.safe_dump(yaml.safe_load(render(VMALERT, "prometheusrule"))["spec"]))
    files.append(spec)
    for scope in ("pod", "fleet"):
        files.append(folder / f"stage-{scope}.yaml")
        files[-1].write_text(render(replace(STAGE_CONFIG, keep_firing_for=""), "yaml", scope))
    return files


def _dry_run(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["vmalert", "-dryRun", *(f"-rule={f}" for f in files)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(bool(fs.missing_binaries()), reason="Debian's victoria-metrics is not installed")
def test_vmalert_loads_every_rules_file(tmp_path: Path) -> None:
    files = _rule_files(tmp_path)
    result = _dry_run(*files)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # and the check can fail: a broken expression, a template function vmalert does not have, and the field
    # the shipped files carry for Prometheus
    broken = tmp_path / "broken.yaml"
    text = files[0].read_text()
    broken.write_text(text.replace("rate(rooflight_engine_steps_total[5m])", "rate(rooflight_engine_steps_total[5m]", 1))
    assert _dry_run(broken).returncode != 0
    broken.write_text(text.replace("| humanizePercentage", "| humanizeNothing", 1))
    assert _dry_run(broken).returncode != 0
    assert _dry_run(OUTPUTS["yaml"]).returncode != 0, "vmalert now knows keep_firing_for: ship one file for both"


def _template_queries(rule: dict[str, Any]) -> list[str]:
    """The PromQL an alert's annotations run when it fires (`printf "<query>" $self "<arg>"... | query`),
    with its own labels (%[1]s) as one cluster's matcher and each argument in place."""
    out = []
    for text in rule.get("annotations", {}).values():
        for query, args in re.findall(r'printf "([^"]*)" \$self((?: "[^"]*")*) \| query', text):
            values = re.findall(r'"([^"]*)"', args)
            query = query.replace("%[1]s", 'cluster="east", ')
            for i, value in enumerate(values, start=2):
                query = query.replace(f"%[{i}]q", f'"{value}"')
            out.append(query)
    return out


@pytest.mark.victoriametrics
@pytest.mark.skipif(bool(fs.missing_binaries()), reason="Debian's victoria-metrics is not installed")
def test_victoria_metrics_runs_every_expression_and_template_query() -> None:
    # vmalert -dryRun parses; an unknown function passes it and fails only when the ruler queries. So run
    # each one on a real (empty) VictoriaMetrics: an answer, even an empty one, is a query it can execute.
    root = Path(tempfile.mkdtemp(prefix="rooflight-vm-"))
    vm = fs.Daemon("victoria-metrics", root)
    try:
        vm.start(["victoria-metrics", f"-storageDataPath={vm.dir / 'data'}", f"-httpListenAddr=127.0.0.1:{vm.port}",
                  "-loggerLevel=WARN"], "/health")
        store = fs.Store(vm, "victoria-metrics")
        rules = rules_of(RulesConfig(), "all") + rules_of(RulesConfig(), "fleet") + rules_of(STAGE_CONFIG, "fleet")
        queries = list(dict.fromkeys([r["expr"] for r in rules] + [q for r in rules for q in _template_queries(r)]))
        failed = []
        for query in queries:
            try:
                store.query(query)
            except fs.PromError as exc:
                failed.append(f"{query}\n  -> {exc}")
        assert failed == [], "\n".join(failed)
        assert len([q for r in rules for q in _template_queries(r)]) >= 10
        with pytest.raises(fs.PromError, match="unknown func"):
            store.query("sort_by_label_nonexistent(up)")
    finally:
        vm.stop()
        shutil.rmtree(root, ignore_errors=True)
