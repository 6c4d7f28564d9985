"""Composite detectors evaluated at the agent's sampling resolution: what binds the batch, and why ITL stutters.

Each detector turns a handful of windowed values into a verdict the exposition exports as a 0/1 gauge
(names in agent/metrics/names.py; each detector's title, series, alert and panel are declared once in
agent/metrics/registry.py, docs/detectors.md). The definitions are in docs/physics.md (sections Head-of-line
blocking and Batch verdicts); what to do about each is in docs/runbooks.md:

- head-of-line blocking (`HEAD_OF_LINE_BLOCKING`, with `ITL_INFLATION` = the factor itself):
  the worst ITL since the previous sample (the ITL histogram's highest bucket that gained
  observations) inflates to at least `hol_inflation` x its own recent median (the median of that worst
  over the longest window) while prefill work is in the batch: where the engine says how many tokens
  each step ran (vLLM's iteration_tokens_total), the largest step of the last 2 s grew to at least
  `hol_step_inflation` x the usual largest step (of the recent seconds that ran a prefill, the value
  80% of them stay at or under), which is what a long prompt run whole is; elsewhere, computed prompt
  tokens per step over the short window at least `hol_min_prefill_tokens_per_step`. Without the step,
  any stall of a busy host (a starved API server, a noisy neighbour) while short prompts keep arriving
  counts, and on a shared CPU host those stalls dwarf a prefill's (docs/physics.md, section
  Head-of-line blocking). One long prompt run whole stalls every decode for one step; at the agent's
  1 s resolution that step is visible, where its few observations vanish below p99 in a 10 s or 1 m
  window. The derive step (signals/policy.py) holds the flag up `hol_hold_seconds` after the
  stall so a 15-30 s Prometheus scrape sees it. Not while the engine preempts (short-window rate above
  `hol_max_preemptions_per_second`): a preempted sequence's next token comes seconds later and its
  recompute is prefill, so the tail inflates at the KV wall too; that is the capacity-capped verdict's
  to name, not head-of-line's. An unknown preemption rate does not rule head-of-line out.
  Where the client-side proxy relays the target's streams, the worst and its median are the exact
  per-token gaps it saw (`ITL_FROM_PROXY`) instead of the engine's bucket edges (`ITL_FROM_ENGINE`);
  the verdict says which (`itl_source`, exported as HEAD_OF_LINE_SOURCE).
- capacity-capped batch (`BATCH_CAPACITY_CAPPED`): KV occupancy at the wall (its peak over the short
  window at least `capacity_kv_usage`), preemptions climbing (rate above
  `capacity_min_preemptions_per_second`) and requests waiting. The memory wall, not the scheduler.
- admission-bound batch (`BATCH_ADMISSION_BOUND`): requests waited through the whole short window
  (minimum at least `admission_min_waiting`) while the batch sat below `admission_max_batch_fraction` of its
  cap and KV had room (occupancy below `kv_room_usage`). Something upstream of the batch is binding.
- batch at its configured maximum (`BATCH_AT_CONFIGURED_MAX`): running reached the cap while KV had room.
  A config lever (max_num_seqs and friends), not the wall.
- engine stalled (`ENGINE_STALLED`): requests held (running or waiting, never 0) through the last
  `stall_seconds` and not one engine step nor one prompt or generated token in them, from an engine whose
  /metrics answered every sample. Hung, not slow: a slow engine still moves its counters. The Prometheus
  alert RooflightEngineStalled (rules/health.py) pages on the same condition over minutes.

Every verdict is three-valued: True, False, or None when the inputs cannot tell. Conditions combine with
Kleene logic, so one input that rules a verdict out gives False even if another input is missing.
Pure: no I/O, no clock; the sampler computes the inputs from its windows.
"""

from __future__ import annotations

from dataclasses import dataclass

from rooflight.agent.errors import ConfigError

ITL_FROM_ENGINE = "engine"  # the ITL histogram's buckets, as the engine exports them
ITL_FROM_PROXY = "proxy"  # the exact gaps between tokens, as the client-side proxy relayed them
ITL_SOURCES = (ITL_FROM_ENGINE, ITL_FROM_PROXY)


@dataclass(frozen=True)
class DetectorThresholds:
    """The knobs of every detector, with defaults taken from the worked numbers of docs/physics.md.

    hol_inflation: worst-ITL / its recent median at which stutter counts as blocking. A long prompt run
        whole stretches one step ~43x (260 ms against a 6 ms baseline); chunked prefill brings that to ~4x.
    hol_step_inflation: the largest recent step / the usual largest step (tokens a
        step ran, where the engine tells them) at which the stall counts as a prefill's. vLLM's step buckets
        are powers of two, so 3 asks for a step two buckets above the usual largest one (4x).
    hol_hold_seconds: how long the flag stays up after the last stall (a stall lasts one step).
    hol_min_prefill_tokens_per_step: computed prompt tokens per engine step (short-window average) that
        count as prefill work in the batch. One 8,000-token prompt over 10 s of 6 ms steps averages ~5.
    hol_min_itl_seconds: an absolute floor under which inflation is not reported as blocking
        (0 = no floor); set it to your ITL SLO threshold to ignore harmless jitter.
    hol_max_preemptions_per_second: preemption rate above which an inflated tail is the KV wall's doing.
    capacity_kv_usage: KV occupancy whose short-window peak counts as the wall. A peak, not a mean or a
        minimum: a small pool thrashes (a real vLLM with 10 blocks swings between 0 and 100% as whole
        batches are preempted and recomputed), and with preemptions climbing the wall was hit in any case.
    capacity_min_preemptions_per_second: preemption rate that must be exceeded (strictly).
    capacity_min_waiting: queued requests needed for the batch to be capped rather than merely full.
    admission_min_waiting: minimum queue over the short window: the queue persisted, not a blip.
    admission_max_batch_fraction: running / cap below this is "well below its cap".
    kv_room_usage: KV occupancy below this means KV has room (admission-bound, at-configured-max).
    stall_seconds: how long requests must be held with no step and no token for the engine to be stalled.
        Longer than any one engine step: chunked prefill keeps steps well under a second; a whole 100k-token
        prompt on a slow GPU takes seconds, not half a minute.
    """

    hol_inflation: float = 3.0
    hol_step_inflation: float = 3.0
    hol_hold_seconds: float = 30.0
    hol_min_prefill_tokens_per_step: float = 1.0
    hol_min_itl_seconds: float = 0.0
    hol_max_preemptions_per_second: float = 0.0
    capacity_kv_usage: float = 0.95
    capacity_min_preemptions_per_second: float = 0.0
    capacity_min_waiting: float = 1.0
    admission_min_waiting: float = 1.0
    admission_max_batch_fraction: float = 0.5
    kv_room_usage: float = 0.8
    stall_seconds: float = 30.0

    def __post_init__(self) -> None:
        for name in ("hol_inflation", "hol_step_inflation"):
            if not getattr(self, name) > 1.0:
                raise ConfigError(f"{name} must be above 1 (got {getattr(self, name)})")
        for name in ("capacity_kv_usage", "admission_max_batch_fraction", "kv_room_usage"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ConfigError(f"{name} must be in (0, 1] (got {value})")
        for name in (
            "hol_min_prefill_tokens_per_step",
            "hol_min_itl_seconds",
            "hol_max_preemptions_per_second",
            "hol_hold_seconds",
            "capacity_min_preemptions_per_second",
            "capacity_min_waiting",
            "admission_min_waiting",
            "stall_seconds",
        ):
            value = getattr(self, name)
            if not value >= 0.0:
                raise ConfigError(f"{name} must be >= 0 (got {value})")


@dataclass(frozen=True)
class DetectorInputs:
    """Windowed values for one (target, model, rank); None where the source or window does not say."""

    itl_worst_recent: float | None  # worst ITL since the previous sample (bucket upper bound), seconds
    itl_worst_baseline: float | None  # median of that worst over the longest window, seconds
    prefill_tokens_per_step_short: float | None  # computed prompt tokens / engine steps over 10 s
    kv_usage: float | None  # KV occupancy now, 0..1
    kv_usage_peak_short: float | None  # its peak over the short window
    preemptions_per_second_short: float | None
    running: float | None
    waiting: float | None
    waiting_min_short: float | None  # minimum queue over the short window
    batch_max: float | None  # configured batch cap (max_num_seqs etc.)
    itl_source: str = ITL_FROM_ENGINE  # where itl_worst_recent and its baseline come from
    # Over the last `stall_seconds` (None while the history is shorter, or a count is missing):
    held_min_stall: float | None = None  # the least running + waiting seen in it
    progress_stall: float | None = None  # engine steps + prompt + generated tokens it gained
    # The largest step of the last 2 s (tokens, bucket upper bound) and the usual largest step
    # over the longest window (the sampler's baseline); both None where the engine does not tell its steps.
    step_tokens_largest_recent: float | None = None
    step_tokens_largest_baseline: float | None = None


@dataclass(frozen=True)
class Verdicts:
    """What the detectors concluded; None = cannot tell."""

    head_of_line: bool | None
    itl_inflation: float | None
    capacity_capped: bool | None
    admission_bound: bool | None
    at_configured_max: bool | None
    itl_source: str = ITL_FROM_ENGINE  # which ITL source judged head-of-line
    engine_stalled: bool | None = None


def _all(*conditions: bool | None) -> bool | None:
    """Kleene AND: False if any is False, else None if any is None, else True."""
    if any(c is False for c in conditions):
        return False
    if any(c is None for c in conditions):
        return None
    return True


def _at_least(value: float | None, bound: float) -> bool | None:
    return None if value is None else value >= bound


def _above(value: float | None, bound: float) -> bool | None:
    return None if value is None else value > bound


def _below(value: float | None, bound: float) -> bool | None:
    return None if value is None else value < bound


# Bucket edges are decimal: 0.3 / 0.1 is 2.9999999999999996 in binary, and must count as 3x.
_RATIO_SLACK = 1e-9


def itl_inflation(itl_worst_recent: float | None, itl_worst_baseline: float | None) -> float | None:
    """Worst ITL now over its own recent median; None when either is unknown or the median is not positive."""
    return _over_median(itl_worst_recent, itl_worst_baseline)


def _over_median(recent: float | None, median: float | None) -> float | None:
    if recent is None or median is None or median <= 0.0:
        return None
    return recent / median


def head_of_line(inputs: DetectorInputs, t: DetectorThresholds) -> tuple[bool | None, float | None]:
    """The ITL tail inflated against its median while prefill work shared the batch, in a span whose
    largest step (where the engine tells it) grew far past the usual largest step."""
    factor = itl_inflation(inputs.itl_worst_recent, inputs.itl_worst_baseline)
    preemptions = inputs.preemptions_per_second_short
    verdict = _all(
        _at_least(factor, t.hol_inflation * (1.0 - _RATIO_SLACK)),
        _at_least(inputs.itl_worst_recent, t.hol_min_itl_seconds),
        _prefill_in_the_batch(inputs, t),
        True if preemptions is None else preemptions <= t.hol_max_preemptions_per_second,
    )
    return verdict, factor


def _prefill_in_the_batch(inputs: DetectorInputs, t: DetectorThresholds) -> bool | None:
    """Where the engine tells its steps' sizes: a recent step at least `hol_step_inflation` x the usual
    largest step (None while the usual one is unknown). That is the prefill the stall needs, where an
    average over 10 s is not: one 1,700-token prompt among 50-token ones read 0.8-0.9 prompt tokens a step
    on a real vLLM. Elsewhere: computed prompt tokens per step over the short window."""
    recent, baseline = inputs.step_tokens_largest_recent, inputs.step_tokens_largest_baseline
    if recent is None and baseline is None:
        return _at_least(inputs.prefill_tokens_per_step_short, t.hol_min_prefill_tokens_per_step)
    return _at_least(_over_median(recent, baseline), t.hol_step_inflation * (1.0 - _RATIO_SLACK))


def capacity_capped(inputs: DetectorInputs, t: DetectorThresholds) -> bool | None:
    """KV pinned near full, preemptions climbing, requests waiting: the memory wall."""
    return _all(
        _at_least(inputs.kv_usage_peak_short, t.capacity_kv_usage),
        _above(inputs.preemptions_per_second_short, t.capacity_min_preemptions_per_second),
        _at_least(inputs.waiting, t.capacity_min_waiting),
    )


def _batch_fraction(running: float | None, batch_max: float | None) -> float | None:
    if running is None or batch_max is None or batch_max <= 0.0:
        return None
    return running / batch_max


def admission_bound(inputs: DetectorInputs, t: DetectorThresholds) -> bool | None:
    """A queue persisted while the batch was well below its cap and KV had room."""
    return _all(
        _at_least(inputs.waiting_min_short, t.admission_min_waiting),
        _below(_batch_fraction(inputs.running, inputs.batch_max), t.admission_max_batch_fraction),
        _below(inputs.kv_usage, t.kv_room_usage),
    )


def at_configured_max(inputs: DetectorInputs, t: DetectorThresholds) -> bool | None:
    """The batch reached its configured cap while KV still had room: raise the cap, not the hardware."""
    return _all(
        _at_least(_batch_fraction(inputs.running, inputs.batch_max), 1.0),
        _below(inputs.kv_usage, t.kv_room_usage),
    )


def engine_stalled(inputs: DetectorInputs) -> bool | None:
    """Requests held through the stall window and no step or token in it: hung, not slow."""
    return _all(
        _above(inputs.held_min_stall, 0.0),
        None if inputs.progress_stall is None else inputs.progress_stall <= 0.0,
    )


def evaluate(inputs: DetectorInputs, thresholds: DetectorThresholds) -> Verdicts:
    """Every detector on one set of windowed inputs."""
    hol, factor = head_of_line(inputs, thresholds)
    return Verdicts(
        head_of_line=hol,
        itl_inflation=factor,
        capacity_capped=capacity_capped(inputs, thresholds),
        admission_bound=admission_bound(inputs, thresholds),
        at_configured_max=at_configured_max(inputs, thresholds),
        itl_source=inputs.itl_source,
        engine_stalled=engine_stalled(inputs),
    )
