"""The engine's counters as the agent re-exports them: the engine's own values, never growing faster than
the physics its gauges are held to.

`rooflight_generation_tokens_total` and its siblings are the engine's counters, re-exported for the
recording rules to rate and sum across replicas. The windows re-baseline a counter that jumps past
windows.MAX_PLAUSIBLE_RATE, and the gauges withhold a tokens/s past what the GPUs can compute
(signals/bounds.py); a counter exported as the engine wrote it escaped both, so a generation counter
climbing 5e8 tokens/s on one H100 had its gauges withheld while the rule rated the counter at 5e8 tokens/s.

Each re-exported counter is therefore the engine's value with two corrections, one sample at a time:

- an increase past MAX_PLAUSIBLE_RATE x the seconds since the last sample is a jump, not counting: withheld
  whole, the counter re-baselined at the engine's value (windows.correct_counter does the same);
- an increase past the counter's bound (`counter_bounds`: the tokens or steps per second the target's GPUs
  can compute, the bound the gauges use; MAX_PLAUSIBLE_RATE where no model or GPU is known) is exported at
  the bound and the rest owed: exported by the next samples as room allows, up to CARRY_SECONDS of the
  bound (past it the rest is not counted). An engine that counts a request's tokens when it ends (TGI,
  TensorRT-LLM) adds a batch's whole answers in one sample: those tokens arrive late, not lost.

A reset stays a reset: a counter that goes down restarts from zero here too (what was owed forgotten), so
the exported value drops and Prometheus' rate() reads a reset, as it would the engine's own counter. While
nothing was withheld (every honest engine) the exported value is the engine's, value for value. (An agent
restarted after withholding a jump exports the engine's value again, one step up, as before the jump.)
Pure: the caller keeps each counter's `Exported` between samples.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, NamedTuple

from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.signals.bounds import steps_per_second_bound, tokens_per_second_bound
from rooflight.agent.signals.windows import MAX_PLAUSIBLE_RATE
from rooflight.collectors.samples import EngineSeries

CARRY_SECONDS = 60.0  # what an increase past the bound may leave owed, in seconds of the bound
TOKEN_COUNTERS = ("prompt_tokens_total", "generation_tokens_total")
COUNTERS = (*TOKEN_COUNTERS, "steps_total", "preemptions_total", "kv_transfer_failures_total")


class Exported(NamedTuple):
    """One counter as last sampled: the engine's value, the value exported, and what is owed (not yet exported)."""

    raw: float
    exported: float
    owed: float = 0.0


def exported_step(last: Exported | None, raw: float, seconds: float, bound: float) -> Exported:
    """The counter after the engine's `raw`, `seconds` after `last` (None: first seen, exported as it is)."""
    if last is None:
        return Exported(raw, raw)
    if raw < last.raw:  # the engine restarted: counted from zero, exported from zero
        base, step, owed = 0.0, raw, 0.0
    else:
        base, step, owed = last.exported, raw - last.raw, last.owed
    if step > MAX_PLAUSIBLE_RATE * max(seconds, 0.0):
        return Exported(raw, base, owed)  # a jump: not counted
    due = step + owed
    room = bound * max(seconds, 0.0)
    grown = min(due, room)
    return Exported(raw, base + grown, min(due - grown, bound * CARRY_SECONDS))


def counter_bounds(constants: TargetConstants | None) -> dict[str, float]:
    """Each re-exported counter's most per second: the tokens and steps the target's GPUs can compute (the
    bounds the gauges are held to), MAX_PLAUSIBLE_RATE for the rest and where the physics is unknown."""
    tokens = tokens_per_second_bound(constants) or MAX_PLAUSIBLE_RATE
    steps = steps_per_second_bound(constants, 1.0) or MAX_PLAUSIBLE_RATE
    bounds = dict.fromkeys(COUNTERS, MAX_PLAUSIBLE_RATE)
    bounds.update(dict.fromkeys(TOKEN_COUNTERS, min(tokens, MAX_PLAUSIBLE_RATE)))
    bounds["steps_total"] = min(steps, MAX_PLAUSIBLE_RATE)
    return bounds


class ExportedCounters:
    """One series' re-exported counters between samples; `series` gives the sample with them in place."""

    __slots__ = ("_at", "_last")

    def __init__(self) -> None:
        self._at: float | None = None
        self._last: dict[str, Exported] = {}

    def series(self, series: EngineSeries, t: float, bounds: Mapping[str, float]) -> EngineSeries:
        """`series` (sampled at `t`) with each counter as exported: the same object where every one is the
        engine's own. A view rebuilt for the same sample (`t` unchanged) exports the same values."""
        if t != self._at:
            seconds = t - self._at if self._at is not None else 0.0
            self._at = t
            for name in COUNTERS:
                raw = getattr(series, name)
                if raw is not None:
                    self._last[name] = exported_step(self._last.get(name), raw, seconds, bounds[name])
        changes = {name: last.exported for name, last in self._last.items()
                   if getattr(series, name) is not None and last.exported != getattr(series, name)}
        return replace(series, **changes) if changes else series
