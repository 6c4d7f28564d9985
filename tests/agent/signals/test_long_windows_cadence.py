"""At 10 Hz the windows after the shortest are derived again once a second, the shortest on every sample.

A scripted vLLM over real HTTP on a FakeClock, its counters moving by a different amount each sample, so
every derivation differs from the one before. What the agent exports is compared with a fresh
derive_window over the same history: the shortest window must be this sample's, a longer one must be
one derived within the last second (up to a second old, never wrong); at 1 Hz, or for windows so short
that a second is a large share of them, every one is this sample's.
"""

from __future__ import annotations

from typing import AsyncIterator

import pytest

from rooflight.agent.roofline.models import PRESETS
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import build
from rooflight.agent.signals.policy import LONG_WINDOWS_EVERY_SECONDS
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.signals import derive
from support import FakeEngine, started_agent

SHORT, LONG = ("5s", 5.0), ("1m", 60.0)


class ScriptedVllm:
    """vLLM's page after `n` samples: tokens, steps and TTFT observations growing unevenly."""

    def __init__(self) -> None:
        self.n = 0
        self.tokens = self.steps = self.ttft = 0

    def advance(self) -> None:
        self.n += 1
        self.tokens += 100 + 37 * (self.n % 7)
        self.steps += 10 + self.n % 3
        self.ttft += 1 + self.n % 4

    def page(self) -> str:
        lab = 'engine="0",model_name="m"'
        fast = self.ttft // 2
        return "\n".join([
            "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{lab}}} {8 + self.n % 5}",
            "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{lab}}} 0",
            "# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc{{{lab}}} {0.2 + 0.01 * (self.n % 9)}",
            "# TYPE vllm:prompt_tokens_total counter", f"vllm:prompt_tokens_total{{{lab}}} {self.tokens // 2}",
            "# TYPE vllm:generation_tokens_total counter", f"vllm:generation_tokens_total{{{lab}}} {self.tokens}",
            "# TYPE vllm:iteration_tokens_total histogram",
            f'vllm:iteration_tokens_total_bucket{{{lab},le="+Inf"}} {self.steps}',
            f"vllm:iteration_tokens_total_count{{{lab}}} {self.steps}", f"vllm:iteration_tokens_total_sum{{{lab}}} 0",
            "# TYPE vllm:time_to_first_token_seconds histogram",
            f'vllm:time_to_first_token_seconds_bucket{{{lab},le="0.1"}} {fast}',
            f'vllm:time_to_first_token_seconds_bucket{{{lab},le="1.0"}} {self.ttft}',
            f'vllm:time_to_first_token_seconds_bucket{{{lab},le="+Inf"}} {self.ttft}',
            f"vllm:time_to_first_token_seconds_count{{{lab}}} {self.ttft}",
            f"vllm:time_to_first_token_seconds_sum{{{lab}}} 0",
        ]) + "\n"


class Rig:
    def __init__(self, agent: Agent, engine: FakeEngine, clock: FakeClock, interval: float,
                 windows: tuple[tuple[str, float], ...]) -> None:
        self.agent, self.engine, self.clock, self.interval = agent, engine, clock, interval
        self.short, self.long = windows
        self.vllm = ScriptedVllm()
        self.derived: list[tuple[float, derive.WindowValues | None]] = []  # (when, the longer window derived fresh then)

    async def sample(self) -> tuple[derive.WindowValues, ...]:
        """One sample; the windows exported for the series."""
        self.vllm.advance()
        self.engine.body = self.vllm.page()
        self.clock.advance(self.interval)
        await self.agent.sample_engines_once()
        self.derived.append((self.clock.monotonic(), self.fresh(self.long)))
        (view,) = self.agent.snapshot.targets[0].series
        return view.windows

    def derived_within(self, seconds: float) -> list[derive.WindowValues | None]:
        """What fresh derivations of the longer window gave over the last `seconds`."""
        now = self.clock.monotonic()
        return [w for t, w in self.derived if now - t < seconds]

    def fresh(self, window: tuple[str, float]) -> derive.WindowValues | None:
        """The window derived now from the history, as an agent deriving everything on each sample would."""
        loop = self.agent.engines[0]
        (history,) = loop.histories().values()
        (view,) = self.agent.snapshot.targets[0].series
        return derive.derive_window(history, window[0], window[1], self.agent.snapshot.targets[0].constants,
                                    view.series.kv_capacity_tokens, self.agent.config.percentiles)


def _rig(interval: float, windows: tuple[tuple[str, float], ...] = (SHORT, LONG)) -> AsyncIterator[Rig]:
    async def make() -> AsyncIterator[Rig]:
        engine = FakeEngine()
        await engine.start()
        clock = FakeClock()
        config = build({}, {}, {"engine_url": [engine.url], "nvml": False, "process": False,
                                "interval": f"{interval}s", "windows": ",".join(name for name, _ in windows),
                                "model": "llama-3-8b"})
        try:
            async with started_agent(config, loops=False, clock=clock) as agent:
                yield Rig(agent, engine, clock, interval, windows)
        finally:
            await engine.stop()
    return make()


@pytest.fixture
async def rig10() -> AsyncIterator[Rig]:
    async for rig in _rig(0.1):
        yield rig


@pytest.fixture(params=[(1.0, (SHORT, LONG)), (0.1, (("1s", 1.0), ("2s", 2.0)))], ids=["1Hz", "10Hz-2s-window"])
async def every_sample_rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    """At 1 Hz; and at 10 Hz with windows so short that a second is half the longer one."""
    async for rig in _rig(*request.param):
        yield rig


async def _warm(rig: Rig) -> None:
    """Until the long window spans half its length: both windows are exported."""
    while len(await rig.sample()) < 2:
        pass


async def test_at_10_hz_the_long_window_is_at_most_a_second_old_and_the_short_one_is_fresh(rig10: Rig) -> None:
    await _warm(rig10)
    distinct: list[derive.WindowValues] = []
    for _ in range(40):
        short, long = await rig10.sample()
        assert short == rig10.fresh(SHORT)  # every sample
        assert long.window == LONG[0]
        assert long in rig10.derived_within(LONG_WINDOWS_EVERY_SECONDS)  # up to a second old, never wrong
        if not distinct or long != distinct[-1]:
            distinct.append(long)
    # Derived again about once a second (4 s of samples), not on each of the 40 samples.
    assert 3 <= len(distinct) <= 6
    assert all(a.tokens_per_second != b.tokens_per_second for a, b in zip(distinct, distinct[1:]))


async def test_at_1_hz_or_in_short_windows_every_window_is_this_samples(every_sample_rig: Rig) -> None:
    rig = every_sample_rig
    await _warm(rig)
    for _ in range(12):
        short, long = await rig.sample()
        assert short == rig.fresh(rig.short)
        assert long == rig.fresh(rig.long)


async def test_new_constants_derive_the_long_windows_at_once(rig10: Rig) -> None:
    await _warm(rig10)
    _, before = await rig10.sample()
    loop = rig10.agent.engines[0]
    other = next(m for m in PRESETS.values() if m.params_active != loop.model.params_active)
    loop.model = other  # as when the engine's info endpoint names the model
    _, after = await rig10.sample()
    assert after == rig10.fresh(LONG)
    assert after.mfu and after.mfu != before.mfu  # the new model's FLOPs, not the old one's, within the second
