"""Golden agent /metrics per engine: a FakeEngine serves one engine's page, the agent (auto-detecting,
FakeClock) samples it twice 10 s apart, and what it serves is compared byte for byte.

Regenerate after an intended change with ROOFLIGHT_UPDATE_GOLDEN=1 and read the diff. Each file
must also pass `promtool check metrics`. Also here: one agent watching two engines at once (a
vLLM and an SGLang with two DP ranks), each with its own (target, rank) series.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.cli import resolve_models
from rooflight.agent.sampling.config import build
from rooflight.agent.metrics.exposition import registry_for
from rooflight.agent.sampling.sampler import Agent
from rooflight.collectors import coverage
from support import GOLDEN, FakeEngine, check_golden, promtool_clean, sample_text, synthetic_page

TGI_PAGE, TRTLLM_PAGE = synthetic_page("tgi-3x"), synthetic_page("trtllm-serve-2026")
DYNAMO_FRONTEND_PAGE, SGLANG_DP_PAGE = synthetic_page("dynamo-frontend"), synthetic_page("sglang-dp2-tp2-pids")

GOLDEN = GOLDEN / "engines"

PAGES = {
    "sglang": sample_text("sglang-docs-llama31-8b-under-load.prom"),
    "tgi": TGI_PAGE,
    "trtllm": TRTLLM_PAGE,
    "triton": sample_text("triton-trtllm-backend-ifb-readme.prom"),
    "llamacpp": sample_text("llamacpp-server-cpu-load-c8.prom"),
    "dynamo": sample_text("dynamo-sglang-worker-1req.prom"),
    "dynamo-frontend": DYNAMO_FRONTEND_PAGE,
}






async def _agent(urls: list[str], clock: FakeClock) -> Agent:
    # metrics_path: trtllm-serve's real path is /prometheus/metrics; the FakeEngine serves /metrics.
    settings = {"engine_url": urls, "nvml": False, "process": False, "interval": "1s", "windows": "10s,1m",
                "model": "llama-3-8b", "gpu": "h100-sxm", "metrics_path": "/metrics"}
    config = build({}, {}, settings)
    agent = Agent(config, models=resolve_models(config), clock=clock, nvml_lib=None)
    await agent.start(loops=False)
    return agent


def _render(agent: Agent) -> str:
    text = generate_latest(registry_for(lambda: agent.snapshot)).decode()
    for i, target in enumerate(agent.config.targets):
        text = text.replace(target.name, f"ENGINE{i}")  # the fake engines' ports change per run
    return text


async def _observe(agent: Agent, clock: FakeClock) -> str:
    """Two samples 10 s apart, then the agent's page; the agent is stopped either way."""
    try:
        await agent.sample_engines_once()
        clock.advance(10.0)
        await agent.sample_engines_once()
        return _render(agent)
    finally:
        await agent.stop()


@pytest.mark.parametrize("engine", sorted(PAGES))
async def test_golden_engine(fake_engine: FakeEngine, engine: str) -> None:
    clock = FakeClock()
    fake_engine.body = PAGES[engine]
    text = await _observe(await _agent([fake_engine.url], clock), clock)
    promtool_clean(text)
    check_golden(GOLDEN / f"{engine}.prom", text)
    expected = "dynamo" if engine.startswith("dynamo") else engine
    assert f'engine="{expected}"' in text
    assert 'rooflight_source_up{source="engine",target="ENGINE0"} 1.0' in text
    if engine in coverage.ENGINE_MODULES and engine != "dynamo":  # dynamo's column is the frontend's
        for field, cell in coverage.coverage(engine).items():
            if coverage.is_missing(cell) and field != "tensor_parallel_size":  # TP is also a flag (--tp)
                assert coverage.FIELDS[field] + "{" not in text, f"{engine} cannot say {field}, yet it is exported"


async def test_one_agent_two_engines_and_dp_ranks(fake_engine: FakeEngine) -> None:
    second = FakeEngine(body=SGLANG_DP_PAGE)
    await second.start()
    clock = FakeClock()
    try:
        text = await _observe(await _agent([fake_engine.url, second.url], clock), clock)
    finally:
        await second.stop()
    promtool_clean(text)
    check_golden(GOLDEN / "two-targets-vllm-sglang-dp.prom", text)
    assert 'rooflight_requests_running{engine="vllm",model="tiny-llama",rank="0",target="ENGINE0"} 16.0' in text
    assert 'rooflight_requests_running{engine="sglang",model="m",rank="0",target="ENGINE1"} 10.0' in text
    assert 'rooflight_requests_running{engine="sglang",model="m",rank="1",target="ENGINE1"} 4.0' in text
