"""Each family is declared once (agent/metrics/names.py) and everything that shows one reads that declaration:
/metrics, /api/v1/snapshot, /api/v1/status, the catalogue (docs/metrics.md's table) and the dashboards' name
check. A family added to the declarations alone shows in all of them; the catalogue is in the order /metrics
shows the families."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rooflight.agent.config.agent import build
from rooflight.agent.metrics import catalog, family, names
from rooflight.agent.metrics.exposition import registry_for
from rooflight.agent.metrics.snapshot import Snapshot
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.serve.server import snapshot_dict
from rooflight.agent.serve.status import status_dict
from rooflight.dashboards.metrics import declared_rooflight_metrics
from support import GOLDEN, FakeEngine, sample_text, started_agent

TOY = "rooflight_toy_windows_seconds"


async def _snapshot(fake_engine: FakeEngine) -> Snapshot:
    """The agent's snapshot after two recorded vLLM pages 10 s apart (a window filled)."""
    settings = {"engine_url": [fake_engine.url], "process": False, "nvml": False, "interval": "1s",
                "windows": "10s,1m", "model": "llama-3-8b", "gpu": "h100-sxm"}
    clock = FakeClock()
    async with started_agent(build({}, {}, settings), loops=False, clock=clock) as agent:
        for page in ("vllm-cpu-rest-fresh.prom", "vllm-cpu-load-c16.prom"):
            fake_engine.body = sample_text(page)
            await agent.sample_engines_once()
            clock.advance(10.0)
        return agent.snapshot


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> str:
    """One more family, declared as names.py declares one: a window's length, by its name."""
    declare = family.Declarations()
    declare(family.WINDOW, TOY, "seconds", "The window's own length (a test's family).", lambda w: w.seconds,
            api="toy_seconds", page="toy_seconds")
    monkeypatch.setattr(names, "FAMILIES", (*names.FAMILIES, *declare.families))
    return TOY


async def test_a_family_declared_alone_shows_everywhere(toy: str, fake_engine: FakeEngine) -> None:
    snap = await _snapshot(fake_engine)
    text = generate_latest(registry_for(lambda: snap)).decode()
    assert f"# HELP {toy} The window's own length (a test's family).\n# TYPE {toy} gauge" in text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == toy]
    assert [(s.labels["window"], s.value) for s in samples] == [("10s", 10.0)]
    window = snapshot_dict(snap)["targets"][0]["series"][0]["windows"][0]
    assert window["toy_seconds"] == 10.0 and window["mbu"] is not None
    status = status_dict(snap)
    assert status["targets"][0]["series"][0]["windows"][0]["toy_seconds"] == 10.0
    assert status["metric_names"]["toy_seconds"] == toy
    assert f"| `{toy}` | gauge | `target`, `engine`, `model`, `rank`, `window` | seconds |" in catalog.markdown_table()
    assert toy in declared_rooflight_metrics()


def test_without_the_toy_nothing_of_it_remains() -> None:
    assert TOY not in {f.name for f in catalog.families()}


def _family_order(text: str) -> list[str]:
    return re.findall(r"^# TYPE (\S+) ", text, re.M)


def test_the_catalogue_is_in_the_order_metrics_shows_families() -> None:
    """Every golden page of one target lists its families in the catalogue's order (a family without series left
    out). With several targets a family first appears with the first target that has it: the walk's order."""
    order = {f.name: i for i, f in enumerate(catalog.families())}
    pages = sorted(GOLDEN.glob("*.prom")) + sorted((GOLDEN / "engines").glob("*.prom"))
    checked = 0
    for page in pages:
        text = page.read_text()
        if len(set(re.findall(r'target="([^"]*)"', text))) > 1:
            continue
        ours = [order.get(n, order.get(n + "_total")) for n in _family_order(text) if n.startswith("rooflight_")]
        assert ours == sorted(ours), page.name
        checked += 1
    assert checked >= 8


def test_each_family_reads_one_scope_and_is_declared_once() -> None:
    every = catalog.families()
    assert len({f.name for f in every}) == len(every)
    assert [family.SCOPES.index(f.scope) for f in every] == sorted(family.SCOPES.index(f.scope) for f in every)
    for f in every:
        assert f.labels[: len(family.SCOPE_LABELS[f.scope])] == family.SCOPE_LABELS[f.scope], f.name
    assert names.MBU == "rooflight_mbu_ratio" and catalog.BY_NAME[names.MBU].api == "mbu"


def test_a_negative_or_missing_value_is_no_series() -> None:
    kv = catalog.BY_NAME[names.KV_USAGE]
    view = type("View", (), {"series": type("S", (), {"kv_usage_ratio": -0.5})()})()
    assert kv.series(view) == []
    view.series.kv_usage_ratio = None
    assert kv.series(view) == []
    view.series.kv_usage_ratio = 0.25
    assert kv.series(view) == [((), 0.25)]
    tokens = catalog.BY_NAME[names.TOKENS_PER_SECOND]
    window = replace(_window(), tokens_per_second={"prefill": 5.0, "decode": -1.0, "a": 2.0})
    assert tokens.series(window) == [(("a",), 2.0), (("prefill",), 5.0)]  # sorted by phase, the negative left out


def _window() -> object:
    from rooflight.agent.signals.derive import WindowValues

    return WindowValues(window="10s", seconds=10.0)
