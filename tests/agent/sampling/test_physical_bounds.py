"""Throughput, cost and capacity are checked against the GPU's physics, not only MBU/MFU.

A generation counter climbing 5e8 tokens/s (under the 1e9/s counter cut) gave decode 2.6e8 tok/s, a cost of
2.6e-6 per million tokens and a capacity of 0.0005 req/s, while MFU was already withheld. A phase's tokens/s
beyond what the GPUs' peak FLOP/s can compute at the model's FLOPs per token is withheld, and everything
derived from it with it. A FakeEngine serves the page over HTTP; the agent samples it; its exposition is read back.
"""

from __future__ import annotations

import re

from rooflight.agent.signals.bounds import tokens_per_second_bound
from support import Metrics, sample_text, scripted_agent

PAGE = sample_text("vllm-cpu-load-c16.prom")
GENERATION = "vllm:generation_tokens_total"
INTERVAL = 0.5


def _set(page: str, name: str, value: float) -> str:
    pattern = re.compile(rf"^({re.escape(name)}\{{[^}}]*\}}) \S+$", re.M)
    assert pattern.search(page), name
    return pattern.sub(lambda m: f"{m.group(1)} {value!r}", page)


def _values(m: Metrics, name: str, **labels: str) -> list[float]:
    return [v for (n, lbl), v in m.items() if n == name and set(labels.items()) <= set(lbl)]


async def test_an_impossible_decode_rate_and_what_follows_from_it_are_withheld() -> None:
    async with scripted_agent(PAGE, INTERVAL, gpu="h100-sxm", gpu_hour_cost="2.5") as rig:
        value = 8096.0
        for _ in range(14):  # a healthy start: 2,000 decode tokens/s
            value += 1000.0
            m = await rig.sample(_set(PAGE, GENERATION, value))
        healthy = _values(m, "rooflight_tokens_per_second", phase="decode")
        assert healthy and all(v > 0 for v in healthy)
        assert _values(m, "rooflight_cost_per_million_tokens", phase="decode")
        bound = tokens_per_second_bound(rig.agent.snapshot.targets[0].constants)
        assert bound is not None and 2000 < bound < 1e9
        for _ in range(14):  # now 5e8 tokens/s: under the counter cut, far past the GPU
            value += 5e8 * INTERVAL
            m = await rig.sample(_set(PAGE, GENERATION, value))
        decode = _values(m, "rooflight_tokens_per_second", phase="decode", window="5s")
        assert not decode, decode  # before: ~5e8
        assert all(v <= bound for v in _values(m, "rooflight_tokens_per_second", phase="decode"))
        assert not _values(m, "rooflight_cost_per_million_tokens", phase="decode", window="5s")
        assert not _values(m, "rooflight_tokens_per_joule", phase="decode", window="5s")
        for v in _values(m, "rooflight_capacity_decode_tokens_per_second", window="5s"):
            assert v <= bound
