"""`rooflight plan` and the live agent read one step model: the demo's simulated engine at a known load, read
by the agent over real HTTP with one fake clock, gives the capacity and saturation `plan --rate` computes for
the same model, GPU and load, to 1% (docs/physics.md, section The step model)."""

from __future__ import annotations

import argparse
import json

import pytest

from rooflight.agent.config.agent import build
from rooflight.agent.demo import DemoConfig, DemoEngine
from rooflight.agent.demo.engine import Simulator
from rooflight.agent.demo.scenarios import Workload
from rooflight.agent.demo.state import History, mark
from rooflight.agent.plan_cli import register
from rooflight.agent.sampling.clock import FakeClock
from support import started_agent

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
