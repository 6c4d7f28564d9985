"""Power and tokens per joule over a window come from the energy counter's increase over that window, divided
by the span the window's points really cover: hand-computed figures for an agent that has run an hour (the
counter's total since the agent started is far larger than one window's increase) and for a young one (its
points cover less than the nominal window)."""

from __future__ import annotations

import pytest

from rooflight.agent.signals import headroom as hr
from rooflight.agent.signals.derive import WindowValues
from rooflight.agent.signals.windows import SeriesHistory
from support import with_energy

WATTS = 550.0  # one H100 under load, constant: every window's mean power is exactly this


def _gpu_history(seconds: int, watts: float = WATTS, start_joules: float = 9_000_000.0) -> SeriesHistory:
    """One GPU sampled every second for `seconds` s, its NVML energy counter (which counts from the driver's
    load, not the agent's start) rising by `watts` joules a second."""
    history = SeriesHistory(retention=600.0)
    for t in range(seconds + 1):
        history.append(float(t), {hr.ENERGY: start_joules + watts * t}, {}, {})
    return history


@pytest.mark.parametrize("window", [10.0, 60.0, 300.0])
def test_power_is_the_windows_increase_not_the_total_since_the_agent_started(window: float) -> None:
    """After an hour at 550 W, each window reads 550 W (the counter's whole increase since the agent started,
    1,980,000 J, over a 10 s window would read 198,000 W)."""
    history = _gpu_history(3600)
    assert hr.gpu_energy_watts([history], window) == pytest.approx(WATTS, rel=1e-9)
    assert hr.gpu_energy_watts([history, _gpu_history(3600, watts=300.0)], window) == pytest.approx(850.0, rel=1e-9)


def test_power_is_over_the_span_the_points_cover_not_the_nominal_window() -> None:
    """6 s into a 10 s window (points at 0..6 s, more than half of it): 3,300 J over 6 s is 550 W, not 330 W."""
    history = _gpu_history(6)
    assert hr.gpu_energy_watts([history], 10.0) == pytest.approx(WATTS, rel=1e-9)


def test_tokens_per_joule_after_an_hour_is_tokens_per_second_over_the_windows_power() -> None:
    """1,100 decode tokens/s on a GPU at 550 W, decode taking all of its time: 2 tokens per joule, in every
    window, however long the agent ran (each phase is charged its share of the GPU's time)."""
    history = _gpu_history(3600)
    windows = [WindowValues(window=name, seconds=s, tokens_per_second={"decode": 1100.0})  # type: ignore[arg-type]
               for name, s in (("10s", 10.0), ("1m", 60.0), ("5m", 300.0))]
    for w in with_energy(windows, lambda seconds: hr.gpu_energy_watts([history], seconds)):
        assert w.energy_watts == pytest.approx(WATTS, rel=1e-9), w.window
        assert hr.tokens_per_joule(w, {"decode": 1.0}) == pytest.approx({"decode": 2.0}, rel=1e-9), w.window
