"""Each window is derived again once it is a sixtieth of its length old: a 1m window once a second, a 5m one
every 5 s, a 10s one every other sample at 10 Hz.

A scripted vLLM over real HTTP on a FakeClock, its counters moving by a different amount each sample, so
every derivation differs from the one before. What the agent exports is compared with a fresh
derive_window over the same history: a window must be one derived within the last sixtieth of its length
(up to a second old for 1m, never wrong), and its capacity signals those of the window exported; at 1 Hz a
1m window, or windows so short that a sample is a large share of a sixtieth of them, are this sample's.
"""

from __future__ import annotations

from typing import AsyncIterator

import pytest

from rooflight.agent.roofline.models import PRESETS
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import build
from rooflight.agent.signals.headroom import window_signals
from rooflight.agent.signals.policy import WINDOW_STALE_SHARE
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.signals import derive
from support import FakeEngine, started_agent

SHORT, LONG, LONGEST = ("5s", 5.0), ("1m", 60.0), ("5m", 300.0)


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
        self.short, *self.longer = windows
        self.long = self.longer[0]
        self.vllm = ScriptedVllm()
        # (when, each window by name as derived fresh then)
        self.derived: list[tuple[float, dict[str, derive.WindowValues | None]]] = []

    async def sample(self) -> tuple[derive.WindowValues, ...]:
        """One sample; the windows exported for the series."""
        self.vllm.advance()
        self.engine.body = self.vllm.page()
        self.clock.advance(self.interval)
        await self.agent.sample_engines_once()
        self.derived.append((self.clock.monotonic(), {w[0]: self.fresh(w) for w in (self.short, *self.longer)}))
        (view,) = self.agent.snapshot.targets[0].series
        return view.windows

    def derived_within(self, seconds: float, window: tuple[str, float] | None = None) -> list[derive.WindowValues | None]:
        """What fresh derivations of a window (the first longer one by default) gave over the last `seconds`."""
        now = self.clock.monotonic()
        name = (window or self.long)[0]
        return [fresh[name] for t, fresh in self.derived if now - t < seconds]

    def signals_of(self, window: derive.WindowValues) -> object:
        """The capacity signals the agent exports for one of the series' windows."""
        (view,) = self.agent.snapshot.targets[0].series
        return next(s for s in view.signals if s.window == window.window)

    def signals_for(self, window: derive.WindowValues) -> object:
        """The capacity signals a fresh computation gives for an exported window."""
        target = self.agent.snapshot.targets[0]
        (view,) = target.series
        return window_signals(window, target.constants, view.batch_max, view.series.kv_capacity_tokens,
                              target.signal_settings)

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
    """Until the longest window spans half its length: every window is exported."""
    while len(await rig.sample()) < 1 + len(rig.longer):
        pass


def _rederived(exported: list[derive.WindowValues]) -> list[derive.WindowValues]:
    """A window as exported on consecutive samples, once for each time it was derived: the scripted engine moves on
    every sample, so each one derived anew differs from the one before in its rates."""
    distinct = [w for i, w in enumerate(exported) if i == 0 or w != exported[i - 1]]
    assert all(a.tokens_per_second != b.tokens_per_second for a, b in zip(distinct, distinct[1:]))
    return distinct


async def test_at_10_hz_the_long_window_is_at_most_a_second_old_and_the_short_one_is_fresh(rig10: Rig) -> None:
    await _warm(rig10)
    exported: list[derive.WindowValues] = []
    for _ in range(40):
        short, long = await rig10.sample()
        assert short == rig10.fresh(SHORT)  # every sample
        assert long.window == LONG[0]
        assert long in rig10.derived_within(WINDOW_STALE_SHARE * LONG[1])  # up to a second old, never wrong
        exported.append(long)
    # Derived again about once a second (4 s of samples), not on each of the 40 samples.
    assert 3 <= len(_rederived(exported)) <= 6


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


@pytest.fixture
async def rig1_5m() -> AsyncIterator[Rig]:
    async for rig in _rig(1.0, (SHORT, LONG, LONGEST)):
        yield rig


async def test_at_1_hz_a_5m_window_is_at_most_5_s_old_while_1m_is_this_samples(rig1_5m: Rig) -> None:
    rig = rig1_5m
    await _warm(rig)
    exported: list[derive.WindowValues] = []
    for _ in range(20):
        short, long, longest = await rig.sample()
        assert short == rig.fresh(SHORT) and long == rig.fresh(LONG)
        assert longest.window == LONGEST[0]
        assert longest in rig.derived_within(WINDOW_STALE_SHARE * LONGEST[1], LONGEST)  # never wrong
        # The signals kept with a standing 5m window are its own, while the 1m window's move on every sample.
        assert rig.signals_of(longest) == rig.signals_for(longest)
        assert rig.signals_of(long) == rig.signals_for(long)
        exported.append(longest)
    assert 3 <= len(_rederived(exported)) <= 6  # about every fifth of the 20 samples, not each of them


@pytest.fixture
async def rig10_10s() -> AsyncIterator[Rig]:
    async for rig in _rig(0.1, (("10s", 10.0), LONG)):
        yield rig


async def test_at_10_hz_a_10s_window_is_derived_every_other_sample_and_never_wrong(rig10_10s: Rig) -> None:
    rig = rig10_10s
    await _warm(rig)
    exported: list[derive.WindowValues] = []
    for _ in range(20):
        short, _ = await rig.sample()
        assert short.window == "10s"
        assert short in rig.derived_within(WINDOW_STALE_SHARE * 10.0, rig.short)  # this sample's or the one before
        assert rig.signals_of(short) == rig.signals_for(short)  # the signals kept with it are its own
        exported.append(short)
    assert 8 <= len(_rederived(exported)) <= 12  # about every other one of the 20 samples, not each of them
