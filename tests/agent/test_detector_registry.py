"""The detector registry (agent/metrics/registry.py) is the one place a detector is declared.

- A toy detector added to the registry alone (plus a verdict value for it) shows on /metrics, in the
  catalog, on /api/v1/status and the status page (drawn by the page's script in a real browser, where
  Chromium exists), in /api/v1/snapshot, in the rendered alerts and in its dashboard panel, with no other
  module edited; and the runbook check names it until docs/runbooks.md has its section.
- Every alert the registry names has a section in docs/runbooks.md, and each registered gauge alert is
  the one the rules render, with the registry's runbook anchor.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from dataclasses import dataclass, fields, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Iterable

import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from rooflight.agent.metrics import catalog
from rooflight.agent.metrics.snapshot import Snapshot
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import build
from rooflight.agent.serve.server import build_app
from rooflight.agent.metrics import registry
from rooflight.agent.signals.detectors import Verdicts
from rooflight.dashboards import kvbatch
from rooflight.rules.config import RulesConfig
from rooflight.rules.render import groups, render
from support import ROOT, FakeEngine, free_port, sample_text, started_agent

RUNBOOKS = ROOT / "docs" / "runbooks.md"

TOY = registry.Detector(
    key="toy_stuck",
    title="Toy stuck",
    sentence="The toy has been stuck for a while: nothing a real engine does, only this test's detector.",
    flag=registry.Series("rooflight_toy_stuck", "1 while the toy is stuck (a test's detector)."),
    alert="RooflightToyStuck",
    rule=registry.GaugeAlert("The toy is stuck.", "avg_over_time", "rooflight_toy_stuck", "kv-batch"),
    panel=registry.Panel("kv-batch", registry.KV_BATCH_PANEL, "toy stuck", "D"),
)


@dataclass(frozen=True)
class ToyVerdicts(Verdicts):
    """The one thing a new detector adds beside its registry entry: its verdict."""

    toy_stuck: bool | None = None


def runbook_sections() -> set[str]:
    return {h.strip().lower() for h in re.findall(r"^## (\S+)", RUNBOOKS.read_text(), re.M)}


def missing_runbooks(alerts: Iterable[str]) -> list[str]:
    """The runbook check: alerts whose anchor has no section in docs/runbooks.md."""
    sections = runbook_sections()
    return [a for a in alerts if registry.runbook_anchor(a) not in sections]


def test_every_registered_alert_has_a_runbook_section() -> None:
    assert registry.alerts(), "the registry names no alert"
    assert missing_runbooks(registry.alerts()) == []


def test_the_runbook_check_covers_the_families_alerts_too() -> None:
    """alerts() is what the runbook check reads: a family's alert (the low decode MBU page) is in it as well as
    every detector's, each once (the admission-bound runbook serves two detectors)."""
    named = registry.alerts()
    assert "RooflightLowDecodeMBU" in named and "RooflightHeadOfLineBlocking" in named
    assert len(named) == len(set(named)) and named.count("RooflightBatchAdmissionBound") == 1


def test_registered_gauge_alerts_are_the_rendered_ones() -> None:
    config = RulesConfig()
    rendered = {r["alert"]: r for g in groups(config) for r in g["rules"] if "alert" in r}
    for d in registry.detectors():
        assert d.alert in rendered, f"{d.key}: no rule renders {d.alert}"
        assert rendered[d.alert]["annotations"]["runbook_url"] == f"{config.runbook_base_url}#{d.runbook_anchor}"
    for f in registry.families():
        if f.alert:
            assert f.alert in rendered and f"/d/rooflight-{f.board}" in rendered[f.alert]["annotations"]["dashboard_url"]
    for d in registry.gauge_alerts():
        assert d.rule is not None
        expr = rendered[d.alert]["expr"]
        assert f"avg_over_time({d.flag.metric}[" in expr and f"{d.rule.over}({d.rule.metric}[" in expr, d.key
        assert rendered[d.alert]["annotations"]["summary"] == d.rule.summary


def test_page_metrics_name_exported_series() -> None:
    """Every number the status page names a series for is one the catalog declares."""
    declared = {d.name for d in catalog.all_defs()}
    names = registry.page_metrics()
    assert names["mbu"] == "rooflight_mbu_ratio" and names["itl_inflation"] == "rooflight_itl_tail_inflation_ratio"
    assert set(names.values()) <= declared


def test_registry_accessors() -> None:
    assert registry.verdict_keys() == ("head_of_line", "capacity_capped", "admission_bound", "at_configured_max",
                                       "engine_stalled")
    assert {f.name for f in fields(Verdicts)} >= set(registry.verdict_keys())
    assert registry.nvtx_marks() == (("head_of_line", "head-of-line stall"),
                                     ("capacity_capped", "capacity-capped batch"),
                                     ("admission_bound", "admission-bound batch"))
    assert registry.by_key("engine_stalled").alert == "RooflightEngineStalled"
    with pytest.raises(KeyError):
        registry.by_key("nope")


def test_docs_table_lists_every_detector() -> None:
    """docs/detectors.md's table: one row per registered detector, with its gauge and its alert."""
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", (ROOT / "docs" / "detectors.md").read_text(),
                                                         re.M)}
    assert set(rows) == set(registry.verdict_keys())
    for d in registry.detectors():
        assert f"`{d.flag.metric}`" in rows[d.key] and d.alert in rows[d.key], d.key


# -- the toy -----------------------------------------------------------------------------------------

@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> registry.Detector:
    monkeypatch.setattr(registry, "DETECTORS", (*registry.DETECTORS, TOY))
    return TOY


def _with_toy_verdicts(snap: Snapshot, stuck: bool) -> Snapshot:
    """The agent's own snapshot, each series' verdicts carrying the toy's verdict too."""
    def toy_verdicts(v: Verdicts | None) -> ToyVerdicts:
        assert v is not None, "the agent judged nothing: no verdicts to extend"
        return ToyVerdicts(**{f.name: getattr(v, f.name) for f in fields(Verdicts)}, toy_stuck=stuck)

    targets = tuple(replace(t, series=tuple(replace(s, verdicts=toy_verdicts(s.verdicts)) for s in t.series))
                    for t in snap.targets)
    return replace(snap, targets=targets)


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


def _values(text: str, name: str) -> list[float]:
    return [s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def _page_shows(url: str, key: str) -> str | None:
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
            state = page.get_attribute(selector, "data-state")
            assert TOY.title in (page.text_content(selector) or "")
            return state
        finally:
            browser.close()


pytestmark = pytest.mark.xdist_group("browser")  # one Chromium at a time, as tests/e2e's browser test


async def test_a_toy_detector_added_to_the_registry_alone_shows_everywhere(
    toy: registry.Detector, fake_engine: FakeEngine
) -> None:
    published = SimpleNamespace(snapshot=_with_toy_verdicts(await _two_samples(fake_engine), stuck=True))

    # /metrics, /api/v1/status, /api/v1/snapshot and the page, over real HTTP
    app = build_app(published, manage_agent=False)  # type: ignore[arg-type]
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    base = f"http://127.0.0.1:{port}"
    try:
        import aiohttp

        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/metrics") as r:
                metrics = await r.text()
            async with http.get(f"{base}/api/v1/status") as r:
                status = await r.json()
            async with http.get(f"{base}/api/v1/snapshot") as r:
                snapshot = await r.json()
        state = await asyncio.to_thread(_page_shows, f"{base}/", toy.key)
    finally:
        await runner.cleanup()

    assert _values(metrics, "rooflight_toy_stuck") == [1.0]
    assert "# HELP rooflight_toy_stuck 1 while the toy is stuck (a test's detector)." in metrics
    verdicts = published.snapshot.targets[0].series[0].verdicts
    judged = [d for d in registry.detectors() if d is not toy and getattr(verdicts, d.key) is not None]
    assert judged, "no real detector judged: nothing to hold them to"
    for d in judged:  # the real detectors are exported as before
        assert _values(metrics, d.flag.metric) == [float(getattr(verdicts, d.key))], d.key
    rows = status["targets"][0]["series"][0]["detectors"]
    assert [r["key"] for r in rows][-1] == "toy_stuck"
    row = rows[-1]
    assert (row["state"], row["title"], row["metric"], row["alert"]) == (
        "active", "Toy stuck", "rooflight_toy_stuck", "RooflightToyStuck")
    assert row["runbook"].endswith("#rooflighttoystuck")
    assert snapshot["targets"][0]["series"][0]["verdicts"]["toy_stuck"] is True
    print(f"status page in Chromium: {state or 'no Chromium here, not looked at'}")
    assert state in (None, "active"), f"the page drew the toy as {state}"

    # the catalog (docs/metrics.md's table) and the alerts
    assert "rooflight_toy_stuck" in {d.name for d in catalog.all_defs()}
    rules = yaml.safe_load(render(RulesConfig()))
    toy_rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "RooflightToyStuck")
    assert toy_rule["expr"].startswith("avg_over_time(rooflight_toy_stuck[10m])\nand on (")  # its value: the share
    assert "(avg_over_time(rooflight_toy_stuck[10m]) >= 0.5)" in toy_rule["expr"]  # the default thresholds
    assert toy_rule["annotations"]["summary"] == "The toy is stuck."
    assert "toy stuck during at least 50% of the last 10m" in toy_rule["annotations"]["description"]
    assert toy_rule["annotations"]["runbook_url"].endswith("#rooflighttoystuck")
    assert "/d/rooflight-kv-batch" in toy_rule["annotations"]["dashboard_url"]
    # the dashboard panel it declared, after the lines already there
    board = json.dumps(kvbatch.dashboard())
    assert 'rooflight_toy_stuck{' in board and "r{{rank}} toy stuck" in board
    # and the runbook check names it until docs/runbooks.md has its section
    assert missing_runbooks(registry.alerts()) == ["RooflightToyStuck"]


async def test_toy_verdict_clear_and_unknown(toy: registry.Detector, fake_engine: FakeEngine) -> None:
    """False exports 0 and shows clear; None (cannot tell) exports nothing and shows unknown."""
    from prometheus_client import generate_latest

    from rooflight.agent.metrics.exposition import registry_for
    from rooflight.agent.serve.status import status_dict

    snapshot = await _two_samples(fake_engine)
    for stuck, value, state in ((False, [0.0], "clear"), (None, [], "unknown")):
        snap = _with_toy_verdicts(snapshot, stuck=stuck)  # type: ignore[arg-type]
        text = generate_latest(registry_for(lambda: snap)).decode()
        assert _values(text, "rooflight_toy_stuck") == value
        rows = status_dict(snap)["targets"][0]["series"][0]["detectors"]
        assert rows[-1]["key"] == "toy_stuck" and rows[-1]["state"] == state


def test_without_the_toy_nothing_of_it_remains() -> None:
    """The fixture's registration is the toy's only trace: the shipped registry and files know nothing of it."""
    assert TOY not in registry.detectors()
    assert "rooflight_toy_stuck" not in {d.name for d in catalog.all_defs()}
    assert "RooflightToyStuck" not in Path(ROOT / "rules" / "rooflight.rules.yaml").read_text()
