"""The incident catalogue (tests/rules/incidents.py) replayed through the shipped rules with promtool: at
each check, exactly the listed alerts fire (by name, severity, pod and burn window), once each, and nothing
else. docs/incidents.md and README's summary line are the catalogue as it is."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from incidents import INCIDENTS, Incident, markdown, summary
from support import ROOT

RULES = ROOT / "rules" / "rooflight.rules.yaml"
FIRING = 'count by (alertname, severity, pod, long) (ALERTS{alertstate="firing"})'


def promtool_test(incident: Incident) -> dict:
    checks = []
    for check in incident.checks:
        samples = []
        for alertname, severity, pod, long in sorted(check.firing):
            labels = {"alertname": alertname, "severity": severity, "pod": pod, "long": long}
            inner = ", ".join(f'{k}="{v}"' for k, v in labels.items() if v)
            samples.append({"labels": "{" + inner + "}", "value": 1})
        checks.append({"expr": FIRING, "eval_time": check.at, "exp_samples": samples})
    return {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m",
                   "input_series": [{"series": k, "values": v} for k, v in incident.series.items()],
                   "promql_expr_test": checks}],
    }


@pytest.mark.prometheus
@pytest.mark.parametrize("incident", INCIDENTS, ids=[i.name for i in INCIDENTS])
def test_the_incident_pages_exactly_as_catalogued(incident: Incident, tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed")
    path = tmp_path / "incident_test.yaml"
    path.write_text(yaml.safe_dump(promtool_test(incident), sort_keys=False))
    run = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, f"{incident.name}: {incident.what}\n{run.stdout}{run.stderr}"


def test_the_catalogue_covers_the_incidents_on_call_meets() -> None:
    names = {i.name for i in INCIDENTS}
    assert len(INCIDENTS) >= 15 and len(names) == len(INCIDENTS)
    paged = [i for i in INCIDENTS if i.pages]
    assert len(paged) >= 10 and len(INCIDENTS) - len(paged) >= 4  # pages, and incidents that must stay quiet
    for incident in INCIDENTS:
        fired = set().union(*(c.firing for c in incident.checks))
        assert bool(fired) == bool(incident.pages), incident.name
        assert incident.checks[0].firing == frozenset() or not incident.pages, f"{incident.name}: no quiet onset"
        assert {name for name, *_ in fired} <= {a.split(" ")[0].rstrip(",") for a in incident.pages.split(", ")} | {
            name for name, *_ in fired if name in incident.pages}, incident.name


def test_docs_and_readme_show_the_catalogue() -> None:
    doc = (ROOT / "docs" / "incidents.md").read_text()
    table = doc.split("<!-- generated: python tests/rules/incidents.py -->\n", 1)[1].split("<!-- end generated -->")[0]
    assert table == markdown(), "docs/incidents.md is stale: regenerate its table with python tests/rules/incidents.py"
    assert summary() in (ROOT / "README.md").read_text()
