"""The shipped Alertmanager config (deploy/alertmanager/alertmanager.yml, from deploy/alertmanager.py) as the real
`amtool` of Debian's prometheus-alertmanager reads it: a valid config, every shipped alert routed to the
receiver its severity says, every inhibition naming shipped alerts. What arrives end to end, inhibitions
included, is tests/e2e/test_notifications_e2e.py's."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy import alertmanager
from rooflight.agent.metrics import names
from support import ROOT

CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
RULES = ROOT / "rules" / "rooflight.rules.yaml"
AMTOOL = shutil.which("amtool")

needs_amtool = pytest.mark.skipif(AMTOOL is None, reason="amtool (Debian's prometheus-alertmanager) is not installed")


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert AMTOOL is not None
    return subprocess.run([AMTOOL, *args], capture_output=True, text=True, timeout=60)


def shipped_alerts() -> dict[str, set[str]]:
    """Each shipped alert's severities (a burn alert has a row of each)."""
    out: dict[str, set[str]] = {}
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                out.setdefault(rule["alert"], set()).add(rule["labels"]["severity"])
    return out


def route(config: Path, **labels: str) -> str:
    """The receiver(s) amtool routes an alert with `labels` to."""
    run = amtool("config", "routes", "test", f"--config.file={config}", *(f"{k}={v}" for k, v in labels.items()))
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout.strip()


@pytest.mark.prometheus
@needs_amtool
def test_amtool_checks_the_shipped_config() -> None:
    run = amtool("check-config", str(CONFIG))
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
    assert f"{len(alertmanager.INHIBITIONS)} inhibit rules" in run.stdout and "3 receivers" in run.stdout


@pytest.mark.prometheus
@needs_amtool
def test_every_shipped_alert_routes_by_its_severity() -> None:
    routed = 0
    for alert, severities in sorted(shipped_alerts().items()):
        for severity in severities:
            labels = {"alertname": alert, "severity": severity, "namespace": "llm", "model": "m", "pod": "p"}
            assert route(CONFIG, **labels) == alertmanager.RECEIVERS[severity], (alert, severity)
            routed += 1
    assert routed >= 30
    assert route(CONFIG, alertname="RooflightSomethingInformational", severity="info") == alertmanager.SILENT
    assert route(CONFIG, alertname="Unlabelled") == alertmanager.SILENT  # no severity: no one is woken


@pytest.mark.prometheus
@needs_amtool
def test_the_stage_config_is_the_shipped_one_with_only_its_waits_and_urls_changed(tmp_path: Path) -> None:
    """The e2e stage runs config(time_scale, urls): still valid, routing the same, waits divided."""
    staged = alertmanager.config(time_scale=20, urls={"pager": "http://127.0.0.1:1/pager",
                                                      "ticket": "http://127.0.0.1:1/ticket"})
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(staged))
    assert amtool("check-config", str(path)).returncode == 0
    shipped = yaml.safe_load(CONFIG.read_text())
    assert staged["inhibit_rules"] == shipped["inhibit_rules"]
    assert [r["matchers"] for r in staged["route"]["routes"]] == [r["matchers"] for r in shipped["route"]["routes"]]
    assert staged["route"]["group_by"] == shipped["route"]["group_by"] == ["cluster", "namespace", "model"]
    assert (staged["route"]["group_wait"], staged["route"]["group_interval"]) == ("1500ms", "15s")
    assert route(path, alertname="RooflightModelDown", severity="critical") == "pager"


def test_inhibitions_name_shipped_alerts_and_never_silence_their_own_cause() -> None:
    shipped = set(shipped_alerts())
    assert shipped == set(names.ALERTS)
    for rule in alertmanager.INHIBITIONS:
        assert rule.source in shipped and set(rule.targets) <= shipped, rule
        assert rule.source not in rule.targets and rule.equal[:2] == ("cluster", "namespace"), rule
    # a model's outage silences its pods' tickets; a pod's engine down never silences a model's page
    sources = {r.source: r for r in alertmanager.INHIBITIONS}
    assert "RooflightEngineDown" in sources["RooflightModelDown"].targets
    assert "RooflightModelDown" not in {t for r in alertmanager.INHIBITIONS for t in r.targets}
    assert {"RooflightGPUHot", "RooflightGPUThrottled"} <= {
        t for r in alertmanager.INHIBITIONS if r.source == "RooflightGPULost" for t in r.targets}
