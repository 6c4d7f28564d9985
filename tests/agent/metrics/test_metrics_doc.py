"""docs/metrics.md cannot drift: its table is the catalog, and the catalog is what the agent serves."""

from __future__ import annotations

import re

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rooflight.agent.metrics.catalog import all_defs, markdown_table
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import build
from rooflight.agent.demo import DemoConfig, DemoEngine
from rooflight.agent.metrics.exposition import registry_for
from rooflight.collectors.nvml import NvmlCollector
from support import GOLDEN, ROOT, started_agent

DOC = ROOT / "docs" / "metrics.md"


def test_doc_table_is_the_catalog() -> None:
    text = DOC.read_text()
    generated = text.split("<!-- generated: python -m rooflight.agent.metrics.catalog -->\n", 1)[1].split("<!-- end generated -->")[0]
    assert generated == markdown_table(), "docs/metrics.md is stale: regenerate its table with python -m rooflight.agent.metrics.catalog"


def _served_names(text: str) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.add(sample.name)
    return names


async def _demo_exposition(scenario: str, seconds: float, **flags: object) -> str:
    clock = FakeClock()
    engine = DemoEngine(DemoConfig(scenario=scenario, seed=5), clock=clock)
    await engine.start()
    config = build({}, {}, {"engine_url": [engine.url], "process": False, "interval": "0.5",
                             "windows": "10s,1m", **flags})
    try:
        async with started_agent(config, loops=False, clock=clock, nvml_lib=engine.nvml) as agent:
            nvml = NvmlCollector(lib=engine.nvml, clock=clock.monotonic)
            try:
                t = 0.0
                while t < seconds:
                    clock.advance(0.5)
                    t += 0.5
                    if scenario == "steady" and abs(t - 45.0) < 0.25:
                        engine.inject("long-prompt")
                    engine.tick()
                    await agent.sample_engines_once()
                    await agent.sample_gpus_once(nvml)
                return generate_latest(registry_for(lambda: agent.snapshot)).decode()
            finally:
                nvml.close()
    finally:
        await engine.stop()


async def test_every_documented_metric_is_served_and_every_served_one_documented() -> None:
    served = set()
    served |= _served_names(await _demo_exposition("steady", 50.0, batch_max=256))
    served |= _served_names(await _demo_exposition("queue", 30.0, batch_max=16, canary=True))
    for golden in GOLDEN.glob("*.prom"):
        served |= _served_names(golden.read_text())
    # the process source only exists where the engine runs as a separate process (tests/collectors/test_process.py)
    process = {d.name for d in all_defs() if d.name.startswith("rooflight_engine_process_")}
    documented = {d.name for d in all_defs()}
    served_rooflight = {n for n in served if n.startswith("rooflight_")}
    assert served_rooflight - documented == set(), "served but not in the catalog"
    missing = documented - process - served_rooflight
    assert missing == set(), f"documented but never served by the demo or the golden files: {sorted(missing)}"


def test_every_catalog_name_follows_the_conventions() -> None:
    for d in all_defs():
        assert re.fullmatch(r"rooflight_[a-z0-9_]+", d.name), d.name
        assert d.name.endswith("_total") == (d.type == "counter"), d.name
        if d.name.endswith("_ratio"):
            assert d.unit in ("ratio", ""), d.name
        assert "quantile" not in d.labels
