"""The real agent on the demo, over real HTTP, with one fake clock driving both: its numbers must
agree with what docs/physics.md predicts for the simulated state, and its detectors must name each scenario.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator

import pytest

from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import build
from rooflight.agent.demo import DemoConfig, DemoEngine
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.metrics.snapshot import SeriesView
from rooflight.collectors.nvml import NvmlCollector
from support import started_agent

# Written here from published numbers, not read from the modules the agent and the simulator share:
# Llama-3-8B (config.json: 32 layers, 8 KV heads, head_dim 128, bf16) and one H100 SXM (datasheet).
LLAMA3_8B_PARAMS = 8_030_261_248
LLAMA3_8B_WEIGHT_BYTES = LLAMA3_8B_PARAMS * 2  # bf16
LLAMA3_8B_TABLE_BYTES = 128_256 * 4_096 * 2  # the untied input embedding table, bf16
LLAMA3_8B_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V, layers, KV heads, head_dim, bf16 = 131072
H100_SXM_BANDWIDTH = 3.35e12  # bytes/s
H100_SXM_BF16_DENSE = 989e12  # FLOP/s
DEMO_BLOCK_TOKENS = 16  # the demo's vLLM block size: the agent sees KV in whole blocks


@asynccontextmanager
async def _demo(scenario: str, **flags: object) -> AsyncIterator[tuple[DemoEngine, Agent, FakeClock]]:
    """The demo engine and an agent (no loops) on one fake clock, both always stopped."""
    clock = FakeClock()
    engine = DemoEngine(DemoConfig(scenario=scenario, seed=3), clock=clock)
    await engine.start()
    try:
        settings = {"engine_url": [engine.url], "process": False, "interval": "0.5", "windows": "10s,1m", **flags}
        async with started_agent(build({}, {}, settings), loops=False, clock=clock, nvml_lib=engine.nvml) as agent:
            yield engine, agent, clock
    finally:
        await engine.stop()


async def _advance(engine: DemoEngine, agent: Agent, clock: FakeClock, seconds: float, *, step: float = 0.5,
                   gpus: bool = True) -> None:
    """Tick the engine and sample it (and, with `gpus`, its simulated GPU) every `step` seconds."""
    nvml = NvmlCollector(lib=engine.nvml, clock=clock.monotonic) if gpus else None
    try:
        t = 0.0
        while t < seconds:
            clock.advance(step)
            t += step
            engine.tick()
            await agent.sample_engines_once()
            if nvml is not None:
                await agent.sample_gpus_once(nvml)
    finally:
        if nvml is not None:
            nvml.close()


def _view(agent: Agent) -> SeriesView:
    (target,) = agent.snapshot.targets
    (view,) = target.series
    return view


async def test_steady_agrees_with_the_physics() -> None:
    async with _demo("steady") as (engine, agent, clock):
        await _advance(engine, agent, clock, 60.0)
        target = agent.snapshot.targets[0]
        short = _view(agent).windows[0]
        state = engine.state(window=short.seconds)
    w = state["window"]
    # The constants both sides use are the model's published shape, not merely each other's.
    model = target.constants.model
    assert LLAMA3_8B_KV_BYTES_PER_TOKEN == 131072
    assert model.kv_bytes_per_token == state["kv_bytes_per_token"] == LLAMA3_8B_KV_BYTES_PER_TOKEN
    assert model.weight_bytes == state["weight_bytes"] == LLAMA3_8B_WEIGHT_BYTES
    assert (target.constants.peak_bandwidth, target.constants.peak_flops) == (H100_SXM_BANDWIDTH, H100_SXM_BF16_DENSE)
    assert short.tokens_per_second["decode"] == pytest.approx(w["decode_tokens_per_second"], rel=0.05)
    assert short.tokens_per_second["prefill"] == pytest.approx(w["prefill_tokens_per_second"], rel=0.05)
    assert short.steps_per_second == pytest.approx(w["steps_per_second"], rel=0.05)
    # MBU's KV term. The simulator streams each decoding sequence's live tokens per step; the agent sees
    # KV through block occupancy, so it counts at most DEMO_BLOCK_TOKENS - 1 more per running sequence
    # (the last block's empty slots), and the blocks of the prompts being prefilled in the step (which the
    # simulator's step does not read), time-weighted where the simulator's bytes are a mean per step, and
    # never fewer, up to the two sides' sampling of the window: 5% beside the blocks' rounding.
    # Both read the weights as the step model does: every weight but the input table, and of that one row
    # a token (physics.md, Live ratios), so the simulator's weights a step are W - table + its tokens' rows.
    rows = short.tokens_per_step * 4096 * 2
    step_weights = LLAMA3_8B_WEIGHT_BYTES - LLAMA3_8B_TABLE_BYTES + rows
    sim_kv_tokens = ((state["mbu"] * H100_SXM_BANDWIDTH / w["steps_per_second"]) - step_weights) \
        / LLAMA3_8B_KV_BYTES_PER_TOKEN  # mean live tokens per step, from the simulator's bytes read
    agent_kv_tokens = short.mean_live_kv_bytes / LLAMA3_8B_KV_BYTES_PER_TOKEN
    rounding = short.mean_running * (DEMO_BLOCK_TOKENS - 1)
    assert sim_kv_tokens > 1000  # a KV term worth testing (about 12% of the bytes)
    assert -0.01 * sim_kv_tokens <= agent_kv_tokens - sim_kv_tokens <= rounding + 0.05 * sim_kv_tokens, (
        agent_kv_tokens, sim_kv_tokens, rounding)
    # MBU itself, recomputed here from the published constants: (W_step + live KV) x steps/s / bandwidth
    # (the rows are linear in the tokens, so the steps' mean tokens give the steps' mean rows) ...
    expected_mbu = (step_weights + short.mean_live_kv_bytes) * short.steps_per_second / H100_SXM_BANDWIDTH
    assert short.mbu == pytest.approx(expected_mbu, rel=1e-9)
    # ... and against the simulator's bytes read: the KV term's tolerance, weighted by its share
    kv_share = 1 - step_weights * short.steps_per_second / H100_SXM_BANDWIDTH / short.mbu
    tolerance = kv_share * (rounding / sim_kv_tokens + 0.05) + 0.001
    assert short.mbu == pytest.approx(state["mbu"], rel=tolerance)
    assert tolerance < 0.015
    # MFU: 2 x the weights a prompt token multiplies (not the input table, not the LM head of the same shape)
    # + the causal attention of the prompts, at the spread of their lengths the window's prompt-length
    # histogram gives (its buckets' points); the LM head once per first token
    mix = short.prompt_length_mix
    assert mix is not None and mix.mean() == pytest.approx(short.mean_prompt_tokens)
    attention = (2 * 32 * (128 + 128) * 32 * sum(share * n * (n + 1) / 2 for share, n in mix.points)
                 / sum(share * n for share, n in mix.points))
    table = LLAMA3_8B_TABLE_BYTES / 2
    expected_mfu = (short.tokens_per_second["prefill"] * (2 * (LLAMA3_8B_PARAMS - 2 * table) + attention)
                    + short.requests_per_second * 2 * table) / H100_SXM_BF16_DENSE
    assert short.mfu["prefill"] == pytest.approx(expected_mfu, rel=1e-9)
    # the simulator counts the same FLOPs of each step it ran (its prompts' own chunks, each decode's own
    # context): both phases together within 5% of the agent's, which reads them from windowed means
    assert short.mfu["prefill"] + short.mfu["decode"] == pytest.approx(state["mfu"], rel=0.05)
    # the measured DRAM bandwidth of the simulated GPU agrees with the derived MBU
    gpu = agent.snapshot.gpu.devices[0]
    assert gpu.dram_bandwidth_utilization_ratio == pytest.approx(short.mbu, rel=0.15)
    # ... and the cross-check gauge says so over the same window
    assert short.dram_utilization is not None
    assert short.mbu_to_dram == pytest.approx(1.0, abs=0.15)
    # nvidia-smi's number reads ~100% while decode uses a fraction of the chip's arithmetic
    assert gpu.kernel_residency_ratio > 0.9 and short.mfu["decode"] < 0.1


async def test_constants_come_from_discovery_and_nvml() -> None:
    async with _demo("steady") as (engine, agent, clock):
        await _advance(engine, agent, clock, 3.0)
        (target,) = agent.snapshot.targets
    assert target.constants.model.name == "llama-3-8b"
    assert target.model_source.startswith("discovered:")
    assert (target.constants.gpu.key, target.constants.gpu_source) == ("h100-sxm", "nvml")


async def test_kv_wall_is_capacity_capped_with_preemptions() -> None:
    async with _demo("kv-wall") as (engine, agent, clock):
        await _advance(engine, agent, clock, 90.0)
        view = _view(agent)
    assert view.series.kv_usage_ratio > 0.95
    assert view.windows[0].preemptions_per_second > 0
    assert view.verdicts.capacity_capped is True
    assert view.verdicts.at_configured_max is not True


async def test_queue_is_at_configured_max_not_the_wall() -> None:
    async with _demo("queue", batch_max=16) as (engine, agent, clock):
        await _advance(engine, agent, clock, 40.0)
        view = _view(agent)
    assert view.series.running == 16
    assert view.verdicts.at_configured_max is True
    assert view.verdicts.capacity_capped is False


async def test_head_of_line_flags_the_long_prompt_stall() -> None:
    async with _demo("steady", nvml=False) as (engine, agent, clock):
        flagged_at = None
        injected_at = None
        for i in range(140):
            clock.advance(0.5)
            if i == 130:
                injected_at = engine.inject("long-prompt")
            engine.tick()
            await agent.sample_engines_once()
            verdicts = _view(agent).verdicts
            flagged = verdicts is not None and verdicts.head_of_line is True
            if i < 130:
                assert not flagged, f"false positive at {i * 0.5}s"
            elif flagged and flagged_at is None:
                flagged_at = clock.monotonic()
        assert flagged_at is not None and injected_at is not None
        assert flagged_at - injected_at <= 2.0
        # the flag is held long enough for a 15-30 s Prometheus scrape to see it, then clears
        held = []
        for _ in range(80):
            clock.advance(0.5)
            engine.tick()
            await agent.sample_engines_once()
            held.append(_view(agent).verdicts.head_of_line)
        assert all(held[: 2 * 25]) and held[-1] is False
