"""`rooflight plan` and the live agent read one step model: the demo's simulated engine at a known load, read
by the agent over real HTTP with one fake clock, gives the capacity and saturation `plan --rate` computes for
the same model, GPU and load, to 1% (docs/physics.md, section The step model)."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import pytest

from prometheus_client import generate_latest

from rooflight.agent.config.agent import build
from rooflight.agent.demo import DemoConfig, DemoEngine
from rooflight.agent.demo.engine import Simulator
from rooflight.agent.demo.scenarios import Workload
from rooflight.agent.demo.state import History, mark
from rooflight.agent.plan_cli import live_series, register
from rooflight.agent.metrics.exposition import registry_for
from rooflight.agent.sampling.clock import FakeClock
from support import FakeEngine, started_agent

RATE, PROMPT, OUTPUT = 10.0, 600, 250  # every request alike: Poisson arrivals of 600 prompt + 250 output tokens
CAP = 256  # vLLM's max_num_seqs


def _plan(capsys: pytest.CaptureFixture[str]) -> dict:
    ap = argparse.ArgumentParser(prog="rooflight")
    register(ap.add_subparsers(dest="command"))
    args = ap.parse_args(["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--rate", str(RATE), "--prompt",
                          str(PROMPT), "--output", str(OUTPUT), "--batch-max", str(CAP), "--itl-slo", "1", "--json"])
    assert args.func(args) == 0
    return json.loads(capsys.readouterr().out)["pools"]


async def test_the_agents_capacity_and_saturation_are_the_plans(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    config = DemoConfig(scenario="steady", seed=3, max_num_seqs=CAP)
    engine = DemoEngine(config, clock=clock)
    # the known load: prompts and outputs of exactly 600 and 250 tokens (lognormals of no spread)
    engine.sim = Simulator(config, engine.plant, Workload(arrival_rate=RATE, prompt_mean=PROMPT, prompt_sigma=0.0,
                                                          output_mean=OUTPUT, output_sigma=0.0, max_num_seqs=CAP))
    engine.history = History()
    engine.history.add(mark(engine.sim))
    await engine.start()
    try:
        settings = {"engine_url": [engine.url], "process": False, "nvml": False, "interval": "1",
                    "windows": "10s,5m", "gpu": "h100-sxm", "batch_max": CAP}
        async with started_agent(build({}, {}, settings), loops=False, clock=clock) as agent:
            for _ in range(330):  # 5 min of window after 30 s of warm-up
                clock.advance(1.0)
                engine.tick()
                await agent.sample_engines_once()
            view = agent.snapshot.targets[0].series[0]
            w, s = view.windows[-1], view.signals[-1]
    finally:
        await engine.stop()
    assert w.window == "5m" and w.requests_per_second == pytest.approx(RATE, rel=0.1)
    # the agent saw the load the plan is given: 600 + 250 tokens a request, the batch cap its first wall
    assert w.tokens_per_second["prefill"] / w.requests_per_second == pytest.approx(PROMPT, rel=1e-3)
    assert w.tokens_per_second["decode"] / w.requests_per_second == pytest.approx(OUTPUT, rel=0.01)
    assert s.capacity is not None and (s.capacity.batch, s.capacity.wall) == (CAP, "batch")
    pools = _plan(capsys)
    assert pools["decode_batch"] == CAP and pools["capacity_source"] == "physics"
    # one group doing both phases at this mix: 1 / (P / prefill capacity + O / decode capacity), the agent's
    # capacity; the rate's share of it, the agent's saturation (its binding wall is the GPU's time)
    assert s.capacity.requests_per_second == pytest.approx(pools["requests_per_second_per_group"], rel=0.01)
    assert s.capacity.phase_tokens_per_second["prefill"] == pytest.approx(pools["prefill_capacity_per_group"],
                                                                          rel=0.01)
    assert s.capacity.phase_tokens_per_second["decode"] == pytest.approx(pools["decode_capacity_per_group"],
                                                                         rel=0.01)
    assert s.binding == "decode_bandwidth"
    assert s.saturation == pytest.approx(pools["load_per_group"] * w.requests_per_second / RATE, rel=0.01)
    print(f"agent capacity {s.capacity.requests_per_second:.3f} req/s, plan {pools['requests_per_second_per_group']:.3f};"
          f" saturation {s.saturation:.4f}, plan at the measured rate "
          f"{pools['load_per_group'] * w.requests_per_second / RATE:.4f}")


async def _agent_page(config: DemoConfig, seconds: int, batch_max: int, windows: str = "10s,1m") -> tuple[str, Any]:
    """The demo engine of `config` read by the agent for `seconds` of fake time: its /metrics page and the last
    window's signals."""
    clock = FakeClock()
    engine = DemoEngine(config, clock=clock)
    await engine.start()
    try:
        settings = {"engine_url": [engine.url], "process": False, "nvml": False, "interval": "1",
                    "windows": windows, "gpu": "h100-sxm", "batch_max": batch_max}
        async with started_agent(build({}, {}, settings), loops=False, clock=clock) as agent:
            for _ in range(seconds):
                clock.advance(1.0)
                engine.tick()
                await agent.sample_engines_once()
            text = generate_latest(registry_for(lambda: agent.snapshot)).decode()
            return text, agent.snapshot.targets[0].series[0].signals[-1]
    finally:
        await engine.stop()


def _plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    ap = argparse.ArgumentParser(prog="rooflight")
    register(ap.add_subparsers(dest="command"))
    args = ap.parse_args(["plan", *argv, "--json"])
    assert args.func(args) == 0
    return json.loads(capsys.readouterr().out)


async def test_from_live_takes_the_agents_batch_at_its_wall_as_the_decode_slots(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's queue scenario caps the batch at 16: the agent's decode capacity C_d is 16 sequences over its
    step at 16, so a decode group holds 16 slots stepping every 16 / C_d. Read as C_d x the 50 ms ITL target it
    was 112 slots (C_d ~2,250 tok/s), 7x the sequences the engine runs at once."""
    page, signals = await _agent_page(DemoConfig(scenario="queue", seed=3), 90, 16)
    assert signals.capacity is not None and (signals.capacity.batch, signals.capacity.wall) == (16, "batch")
    c_d = signals.capacity.phase_tokens_per_second["decode"]
    assert 'rooflight_capacity_decode_batch_requests{' in page
    agent_page = FakeEngine(body=page)  # the agent's page, served over HTTP
    await agent_page.start()
    try:
        pools = (await asyncio.to_thread(_plan_json, capsys, "--from-live", agent_page.url, "--window", "1m",
                                         "--rate", "100"))["pools"]
    finally:
        await agent_page.stop()
    assert pools["capacity_source"] == "live"
    assert pools["decode_slots_per_group"] == 16 and pools["decode_batch"] == 16
    assert pools["decode_step_seconds"] == pytest.approx(16 / c_d, rel=0.02)
    assert c_d * 0.05 > 3 * 16  # the old rule's slot count, C_d x ITL, is several times the batch
    # the same mix from the physics at the same batch cap: the same slots, and the pool within a group of it
    mix = (pools["prompt_tokens"], pools["output_tokens"])
    physics = _plan_json(capsys, "--model", "llama-3-8b", "--gpu", "h100-sxm", "--rate", "100", "--prompt",
                         str(mix[0]), "--output", str(mix[1]), "--batch-max", "16")["pools"]
    assert physics["decode_slots_per_group"] == 16
    assert abs(physics["decode_groups"] - pools["decode_groups"]) <= 1
    print(f"live: C_d {c_d:.0f} tok/s, {pools['decode_slots_per_group']:.0f} slots, {pools['decode_groups']} decode "
          f"groups; physics at --batch-max 16: {physics['decode_groups']}")


def test_plan_and_the_agent_agree_on_a_speculative_deployment(capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3-8B with a Llama-3.2-1B draft, k = 4, 70% of draft tokens accepted (a step keeps 1 + 0.7 x 4 = 3.8
    tokens a sequence), on one H100 SXM at a batch cap of 32, 600 + 250 tokens a request. The agent's capacity
    (signals/headroom.py, called as the agent calls it on a window whose vLLM counters say k = 4 and 3.8 tokens a
    step, 32 sequences of 725 tokens live) and `plan --draft-model` are one step model's, to 1%.

    By hand (bytes of the step at 70% of 3.35 TB/s): the model's weights for 160 verified tokens, 16,060,522,496
    - the 1,050,673,152-byte input table + 160 rows of 8,192 B = 15,011,160,064; the draft (tied: its table is
    its LM head, read whole) 4 x 2,471,628,800 = 9,886,515,200; the KV 32 x 725 x 131,072 = 3,040,870,400:
    27,938,545,664 B in 11.91 ms (its 160 x ~15.4 GFLOP take 4.98 ms at 50% of 989 TFLOP/s: memory-bound), so
    3.135 ms a token and 32 / 3.135 ms = 10,210 decode tok/s: 2.5x the 4,160 of one token a step, 0.65x the
    15,800 that 3.8 tokens a step would give without the draft's 9.9 GB a step."""
    from dataclasses import replace as _replace

    from rooflight.agent.roofline.constants import TargetConstants
    from rooflight.agent.roofline.gpus import get_profile
    from rooflight.agent.roofline.models import preset
    from rooflight.agent.roofline.step import Lengths
    from rooflight.agent.signals import headroom as hr
    from rooflight.agent.signals.derive import WindowValues

    cap, k, acceptance = 32, 4, 0.7
    kept = 1 + acceptance * k
    constants = TargetConstants(model=preset("llama-3-8b"), gpu=get_profile("h100-sxm"), gpu_source="flag",
                                draft=preset("llama-3.2-1b"))
    context = PROMPT + OUTPUT / 2  # 725: the live KV per running sequence the window reads
    w = WindowValues(window="1m", seconds=60.0, requests_per_second=RATE,
                     tokens_per_second={"prefill": RATE * PROMPT, "decode": RATE * OUTPUT}, mean_running=20.0,
                     mean_kv_usage=20 * context / 400_000, prompt_length_mix=Lengths.one(PROMPT),
                     spec_decode_draft_length=float(k), spec_decode_tokens_per_step=kept,
                     draft_passes_per_step=float(k))
    agent = hr.capacity(w, constants, cap, 400_000, hr.SignalSettings())
    assert agent is not None and (agent.batch, agent.wall) == (cap, "batch")
    step = (15_011_160_064 + 9_886_515_200 + 32 * 725 * 131_072) / (3.35e12 * 0.7)
    assert round(step * 1e3, 2) == 11.91
    assert agent.phase_tokens_per_second["decode"] == pytest.approx(cap * kept / step, rel=1e-3)
    assert round(agent.phase_tokens_per_second["decode"], -1) == 10_210
    plain = hr.capacity(_replace(w, spec_decode_draft_length=None, spec_decode_tokens_per_step=None,
                                 draft_passes_per_step=None), _replace(constants, draft=None), cap, 400_000,
                        hr.SignalSettings())
    pools = _plan_json(capsys, "--model", "llama-3-8b", "--gpu", "h100-sxm", "--rate", str(RATE), "--prompt",
                       str(PROMPT), "--output", str(OUTPUT), "--batch-max", str(cap), "--itl-slo", "1",
                       "--draft-model", "llama-3.2-1b", "--num-speculative-tokens", str(k), "--draft-acceptance",
                       str(acceptance))["pools"]
    assert pools["decode_batch"] == cap
    assert pools["decode_capacity_per_group"] == pytest.approx(agent.phase_tokens_per_second["decode"], rel=0.01)
    assert pools["prefill_capacity_per_group"] == pytest.approx(agent.phase_tokens_per_second["prefill"], rel=0.01)
    assert pools["requests_per_second_per_group"] == pytest.approx(agent.requests_per_second, rel=0.01)
    # without speculation, one token a step of 32 (the table's 32 rows): 4,160 tok/s, and plan says so too
    plain_step = (16_060_522_496 - 1_050_673_152 + 32 * 8192 + 32 * 725 * 131_072) / (3.35e12 * 0.7)
    assert plain is not None and plain.phase_tokens_per_second["decode"] == pytest.approx(cap / plain_step, rel=1e-3)
    assert round(plain.phase_tokens_per_second["decode"], -1) == 4_160
    assert round(cap * kept / (plain_step - 32 * 8192 / 2.345e12 + 160 * 8192 / 2.345e12), -2) == 15_800
    no_draft = _plan_json(capsys, "--model", "llama-3-8b", "--gpu", "h100-sxm", "--rate", str(RATE), "--prompt",
                          str(PROMPT), "--output", str(OUTPUT), "--batch-max", str(cap), "--itl-slo", "1")["pools"]
    assert no_draft["decode_capacity_per_group"] == pytest.approx(plain.phase_tokens_per_second["decode"], rel=0.01)
    print(f"decode capacity with the draft: agent {agent.phase_tokens_per_second['decode']:.0f}, plan "
          f"{pools['decode_capacity_per_group']:.0f} tok/s; without: {plain.phase_tokens_per_second['decode']:.0f}")


LOGNORMAL_SIGMA = 0.7  # the demo's output lengths (agent/demo/scenarios.py, Workload.output_sigma)


async def test_on_the_demos_lognormal_mix_the_output_spread_closes_the_length_bias(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's steady scenario: lognormal prompts and outputs (sigma 0.6 and 0.7). A request is in the running
    batch for as many steps as its output is long, so the batch holds the long ones more often: its mean context
    is P + O (1 + cv^2) / 2, cv^2 = exp(0.7^2) - 1 = 0.632, not P + O / 2. With the mean P and O alone plan's
    capacity is ~4% (requests) and ~7% (decode tokens) above the agent's, which reads the engine's own KV per
    running sequence; with --output-cv 0.795 they agree within 2%."""
    import math

    config = DemoConfig(scenario="steady", seed=3, max_num_seqs=CAP)
    page, s = await _agent_page(config, 330, CAP, windows="10s,5m")
    (live,) = live_series(page)
    prompt, output = live.mix()
    cv = math.sqrt(math.exp(LOGNORMAL_SIGMA ** 2) - 1)
    assert round(cv, 3) == 0.795 and s.capacity is not None and s.capacity.wall == "batch"

    def plan(*extra: str) -> dict:
        return _plan_json(capsys, "--model", "llama-3-8b", "--gpu", "h100-sxm", "--rate", str(RATE), "--prompt",
                          str(prompt), "--output", str(output), "--batch-max", str(CAP), "--itl-slo", "1",
                          *extra)["pools"]

    mean_only, spread = plan(), plan("--output-cv", f"{cv:.3f}")
    agent_req, agent_decode = s.capacity.requests_per_second, s.capacity.phase_tokens_per_second["decode"]
    assert mean_only["requests_per_second_per_group"] > 1.025 * agent_req
    assert mean_only["decode_capacity_per_group"] > 1.05 * agent_decode
    assert spread["requests_per_second_per_group"] == pytest.approx(agent_req, rel=0.02)
    assert spread["decode_capacity_per_group"] == pytest.approx(agent_decode, rel=0.02)
    print(f"mix {prompt:.0f} + {output:.0f}: agent {agent_req:.2f} req/s, {agent_decode:.0f} decode tok/s; plan "
          f"P + O/2 {mean_only['requests_per_second_per_group']:.2f} / {mean_only['decode_capacity_per_group']:.0f}; "
          f"--output-cv {cv:.3f} {spread['requests_per_second_per_group']:.2f} / "
          f"{spread['decode_capacity_per_group']:.0f}")
