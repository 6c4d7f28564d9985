"""A detector is one module of agent/signals/detectors/, and that module is the only place it is declared.

- docs/detectors.md's walkthrough, done in a copy of the checkout: the `kv_thrash` module it shows, written
  as it shows it, plus its runbook text and `python -m rooflight.regen`, is found on /metrics, on the status
  page (drawn by the page's script in a real browser, where Chromium exists), in /api/v1/status and
  /api/v1/snapshot, in the rules, in its dashboard panel and by the runbook check; and the only production
  module the copy gained or changed is that one.
- A toy detector added at run time is exported 1, 0 or not at all, and shown active, clear or unknown.
- Every alert has a section in docs/runbooks.md; each declared gauge alert is the one the rules render, with
  its runbook anchor; each metric a declaration names is one the agent exports; each declared panel is drawn.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterable

import aiohttp
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from demo_procs import wait_healthy
from rooflight.agent.config.agent import build
from rooflight.agent.metrics import catalog, names
from rooflight.agent.metrics.exposition import registry_for
from rooflight.agent.metrics.snapshot import Snapshot
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.serve.status import status_dict
from rooflight.agent.signals import detectors
from rooflight.agent.signals.detectors.base import Detector, GaugeAlert, Panel, Series
from rooflight.agent.signals.detectors.capacity_capped import KV_BATCH_PANEL
from rooflight.dashboards.generate import render_all
from rooflight.rules.config import RulesConfig
from rooflight.rules.render import groups
from support import ROOT, FakeEngine, free_port, sample_text, started_agent

RUNBOOKS = ROOT / "docs" / "runbooks.md"
pytestmark = pytest.mark.xdist_group("browser")  # one Chromium at a time, as tests/e2e's browser test


def runbook_sections(text: str) -> set[str]:
    return {h.strip().lower() for h in re.findall(r"^## (\S+)", text, re.M)}


def missing_runbooks(alerts: Iterable[str], runbooks: str) -> list[str]:
    """The runbook check: alerts whose anchor has no section in docs/runbooks.md."""
    sections = runbook_sections(runbooks)
    return [a for a in alerts if detectors.runbook_anchor(a) not in sections]


def test_every_alert_has_a_runbook_section() -> None:
    assert missing_runbooks(names.alerts(), RUNBOOKS.read_text()) == []
    assert {d.alert for d in detectors.detectors()} <= set(names.alerts())
    assert "RooflightLowDecodeMBU" in names.alerts() and len(set(names.alerts())) == len(names.alerts())


def test_declared_gauge_alerts_are_the_rendered_ones() -> None:
    config = RulesConfig()
    rendered = {r["alert"]: r for g in groups(config) for r in g["rules"] if "alert" in r}
    for d in detectors.detectors():
        assert d.alert in rendered, f"{d.key}: no rule renders {d.alert}"
        assert rendered[d.alert]["annotations"]["runbook_url"] == f"{config.runbook_base_url}#{d.runbook_anchor}"
        if d.rule is None:
            continue
        rule, alert = rendered[d.alert], config.detector_alert(d.key)
        assert f"avg_over_time({d.flag.metric}[{d.rule.window}])" in rule["expr"], d.key
        assert f"{d.rule.over}({d.rule.metric}[" in rule["expr"], d.key
        assert rule["annotations"]["summary"] == d.rule.summary and rule["for"] == d.rule.for_ == alert.for_
        assert rule["labels"]["severity"] == d.rule.severity and f"/d/rooflight-{d.rule.board}" in rule["annotations"]["dashboard_url"]


def test_every_metric_a_declaration_names_is_exported() -> None:
    """The declarations sit below agent/metrics (they spell the agent's names): each must be the catalogue's."""
    exported = {f.name for f in catalog.families()}
    for d in detectors.detectors():
        assert {s.metric for s in d.exported()} <= exported, d.key
        if d.rule is not None:
            assert d.rule.metric in exported, d.key


def test_every_declared_panel_is_drawn() -> None:
    boards = render_all()
    for d in detectors.detectors():
        if d.panel is not None:
            board = boards[f"rooflight-{d.panel.board}.json"]
            assert f"{d.flag.metric}{{" in board and json.dumps(d.panel.title) in board, d.key


def test_knobs_are_declared_once_and_checked_in_the_order_they_always_were() -> None:
    names_ = [k.name for k in detectors.knobs()]
    assert len(names_) == len(set(names_)) and "kv_room_usage" in names_ and "stall_seconds" in names_
    assert detectors.DetectorThresholds().hol_inflation == 3.0
    with pytest.raises(Exception, match="hol_inflation must be above 1"):  # above-1 knobs are checked first
        detectors.DetectorThresholds(hol_inflation=0.5, kv_room_usage=2.0)
    with pytest.raises(TypeError):
        detectors.DetectorThresholds(no_such_knob=1.0)


# -- a toy detector at run time: its three states -----------------------------------------------------

TOY = Detector(
    key="toy_stuck",
    judge=lambda inputs, t: None,
    order=99,
    title="Toy stuck",
    sentence="The toy has been stuck for a while: nothing a real engine does, only this test's detector.",
    flag=Series("rooflight_toy_stuck", "1 while the toy is stuck (a test's detector)."),
    alert="RooflightToyStuck",
    rule=GaugeAlert("The toy is stuck.", "avg_over_time", "rooflight_toy_stuck", "kv-batch"),
    panel=Panel("kv-batch", KV_BATCH_PANEL, "toy stuck", "D"),
)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Detector:
    monkeypatch.setattr(detectors, "DETECTORS", (*detectors.DETECTORS, TOY))
    return TOY


async def _two_samples(fake_engine: FakeEngine) -> Snapshot:
    """The agent's snapshot after two samples of recorded vLLM pages 10 s apart (windows filled)."""
    settings = {"engine_url": [fake_engine.url], "process": False, "nvml": False, "interval": "1s",
                "windows": "10s,1m", "model": "llama-3-8b", "gpu": "h100-sxm"}
    clock = FakeClock()
    async with started_agent(build({}, {}, settings), loops=False, clock=clock) as agent:
        fake_engine.body = sample_text("vllm-cpu-rest-fresh.prom")
        await agent.sample_engines_once()
        clock.advance(10.0)
        fake_engine.body = sample_text("vllm-cpu-load-c16.prom")
        await agent.sample_engines_once()
        return agent.snapshot


def _with_toy(snap: Snapshot, stuck: bool | None) -> Snapshot:
    from dataclasses import replace

    def series(view: object) -> object:
        assert view.verdicts is not None, "the agent judged nothing: no verdicts to extend"  # type: ignore[attr-defined]
        return replace(view, verdicts=view.verdicts.replace(toy_stuck=stuck))  # type: ignore[attr-defined]

    return replace(snap, targets=tuple(replace(t, series=tuple(series(s) for s in t.series)) for t in snap.targets))


def _values(text: str, name: str) -> list[float]:
    return [s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


async def test_a_toy_detector_is_exported_and_shown_in_each_state(toy: Detector, fake_engine: FakeEngine) -> None:
    """True exports 1 and shows active, False 0 and clear, None (cannot tell) nothing and unknown; the real
    detectors are exported as before, and the toy's alert renders with the generic description."""
    snapshot = await _two_samples(fake_engine)
    for stuck, value, state in ((True, [1.0], "active"), (False, [0.0], "clear"), (None, [], "unknown")):
        snap = _with_toy(snapshot, stuck)
        text = generate_latest(registry_for(lambda: snap)).decode()
        assert _values(text, "rooflight_toy_stuck") == value
        rows = status_dict(snap)["targets"][0]["series"][0]["detectors"]
        assert rows[-1]["key"] == "toy_stuck" and rows[-1]["state"] == state
    verdicts = snapshot.targets[0].series[0].verdicts
    judged = [d for d in detectors.detectors() if d is not toy and getattr(verdicts, d.key) is not None]
    assert judged, "no real detector judged: nothing to hold them to"
    for d in judged:
        assert _values(text, d.flag.metric) == [float(getattr(verdicts, d.key))], d.key
    rule = next(r for g in groups(RulesConfig()) for r in g["rules"] if r.get("alert") == "RooflightToyStuck")
    assert "(avg_over_time(rooflight_toy_stuck[10m]) >= 0.5)" in rule["expr"]  # the declared defaults
    assert "toy stuck during at least 50% of the last 10m" in rule["annotations"]["description"]


def test_without_the_toy_nothing_of_it_remains() -> None:
    assert TOY not in detectors.detectors()
    assert "rooflight_toy_stuck" not in {d.name for d in catalog.all_defs()}
    assert "RooflightToyStuck" not in (ROOT / "rules" / "rooflight.rules.yaml").read_text()


# -- docs/detectors.md's walkthrough, in a copy of the checkout ----------------------------------------

RUNBOOK_TEXT = """
## RooflightKVThrash

Whole batches are preempted and recomputed: the KV pool is too small for the batch it is given. Lower
max_num_seqs, or give the engine more KV memory (gpu_memory_utilization, an fp8 KV cache).
"""
# Copied as a user's clone has them: what git tracks, without what a run leaves behind.
NOT_COPIED = shutil.ignore_patterns(".git", ".venv*", "__pycache__", "node_modules", "build", "dist", "*.egg-info",
                                    ".hypothesis", ".pytest_cache", ".cache")
PRODUCTION = ("agent", "collectors", "rules", "dashboards", "deploy")  # their .py files are the production code


def _module_from_the_docs() -> str:
    """The module docs/detectors.md shows a contributor, as it shows it."""
    doc = (ROOT / "docs" / "detectors.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc.split("## Adding a detector", 1)[1], re.S)
    assert code, "docs/detectors.md shows no module under Adding a detector"
    return "\n".join(line[3:] if line.startswith("   ") else line for line in code.group(1).splitlines()) + "\n"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def _site(copy: Path, site: Path) -> dict[str, str]:
    """An import path on which `rooflight` is the copy's (the editable install maps it to this checkout)."""
    package = site / "rooflight"
    package.mkdir(parents=True)
    for name in ("__init__.py", "__main__.py", "regen.py"):
        (package / name).symlink_to(copy / "agent" / "_root" / name)
    for part in ("agent", "collectors", "rules", "dashboards"):
        (package / part).symlink_to(copy / part)
    return {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}


def _python(env: dict[str, str], cwd: Path, *args: str, timeout: float = 300) -> str:
    run = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, f"python {' '.join(args)}: {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run.stdout


RUNBOOK_CHECK = """
import re, sys
from rooflight.agent.metrics.names import alerts
sections = {h.strip().lower() for h in re.findall(r"^## (\\S+)", open("docs/runbooks.md").read(), re.M)}
print(",".join(a for a in alerts() if a.lower() not in sections))
"""


def _page_shows(url: str, key: str, title: str) -> str | None:
    """The state the status page draws for detector `key`, in headless Chromium; None without Chromium."""
    exe = os.environ.get("ROOFLIGHT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None and not os.environ.get("CI"):
        return None
    assert exe is not None, "CI is set but no Chromium binary was found"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto(url)
            selector = f'li.detector[data-detector="{key}"]'
            page.wait_for_selector(selector, timeout=20_000)
            assert title in (page.text_content(selector) or "")
            return page.get_attribute(selector, "data-state")
        finally:
            browser.close()


@pytest.mark.timeout(600)
async def test_a_detector_added_as_docs_detectors_md_says_shows_everywhere(tmp_path: Path,
                                                                          fake_engine: FakeEngine) -> None:
    copy, module = tmp_path / "rooflight", "agent/signals/detectors/kv_thrash.py"
    shutil.copytree(ROOT, copy, ignore=NOT_COPIED, symlinks=True)
    env = _site(copy, tmp_path / "site")
    before = _files(copy)
    (copy / module).write_text(_module_from_the_docs())
    assert _python(env, copy, "-c", RUNBOOK_CHECK).strip() == "RooflightKVThrash"  # named until its runbook is written
    with (copy / "docs" / "runbooks.md").open("a") as runbooks:
        runbooks.write(RUNBOOK_TEXT)
    assert _python(env, copy, "-c", RUNBOOK_CHECK).strip() == ""
    _python(env, copy, "-m", "rooflight.regen", timeout=480)
    _python(env, copy, "-m", "rooflight.regen", "--check")
    after = _files(copy)

    touched = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
    print(f"files the walkthrough touched: {sorted(touched)}")
    code = {p for p in touched if p.endswith(".py") and p.split("/", 1)[0] in PRODUCTION}
    assert code == {module}, f"production modules touched besides the detector's own: {sorted(code - {module})}"
    assert {"rules/rooflight.rules.yaml", "dashboards/json/rooflight-kv-batch.json", "docs/metrics.md",
            "docs/detectors.md", "docs/metric-contract.md", "deploy/helm/rooflight/values.yaml"} <= touched
    assert any(p.startswith("tests/golden/") for p in touched), "no golden gained the detector's series"

    rules = yaml.safe_load((copy / "rules" / "rooflight.rules.yaml").read_text())
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "RooflightKVThrash")
    assert rule["annotations"]["runbook_url"].endswith("#rooflightkvthrash") and rule["for"] == "10m"
    assert "KV cache thrashing during at least 50% of the last 10m" in rule["annotations"]["description"]  # not "kV"
    board = (copy / "dashboards" / "json" / "rooflight-kv-batch.json").read_text()
    assert "rooflight_kv_thrash{" in board and "r{{rank}} KV thrash" in board
    assert "`kv_thrash`" in (copy / "docs" / "detectors.md").read_text()

    port = free_port()
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rooflight", "run", "--engine-url", fake_engine.url, "--model", "llama-3-8b",
        "--gpu", "h100-sxm", "--no-nvml", "--no-process", "--interval", "0.2s", "--windows", "1s,2s",
        "--listen", f"127.0.0.1:{port}", cwd=copy, env=env, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            await wait_healthy(http, f"{base}/-/ready", agent)
            for _ in range(100):  # until a window is filled and the detectors judge
                async with http.get(f"{base}/metrics") as r:
                    metrics = await r.text()
                if _values(metrics, "rooflight_kv_thrash"):
                    break
                await asyncio.sleep(0.2)
            async with http.get(f"{base}/api/v1/status") as r:
                status = await r.json()
            async with http.get(f"{base}/api/v1/snapshot") as r:
                snapshot = await r.json()
        state = await asyncio.to_thread(_page_shows, f"{base}/", "kv_thrash", "KV cache thrashing")
    finally:
        agent.terminate()
        await agent.wait()

    assert _values(metrics, "rooflight_kv_thrash") == [0.0]  # a steady page: no preemption, no thrash
    assert "# HELP rooflight_kv_thrash 1 while whole batches are preempted and recomputed." in metrics
    row = status["targets"][0]["series"][0]["detectors"][-1]
    assert (row["key"], row["title"], row["state"], row["alert"]) == (
        "kv_thrash", "KV cache thrashing", "clear", "RooflightKVThrash")
    assert row["runbook"].endswith("#rooflightkvthrash")
    assert snapshot["targets"][0]["series"][0]["verdicts"]["kv_thrash"] is False
    print(f"status page in Chromium: {state or 'no Chromium here, not looked at'}")
    assert state in (None, "clear"), f"the page drew kv_thrash as {state}"
