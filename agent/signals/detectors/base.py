"""What a detector module declares, and what its pure function judges from.

A detector is one module of this package (docs/detectors.md): its pure function of the windowed inputs
(DetectorInputs) and its knobs, and one `Detector` declaration that says everything else once: its key
(the Verdicts field its verdict sits in), the title and sentence the status page shows, the series it
exports (its 0/1 gauge, and any number or choice its verdict carries), its knobs with their defaults and
checks, the alert on-call gets (its runbook section is the alert's name) and the rule the rule generator
renders over its gauge (with that alert's `for` and severity, settings of `rooflight rules`), its line in a
dashboard panel, and the NVTX mark a rising edge leaves in a profile. The metric names a declaration
refers to are the agent's (agent/metrics/names.py; this package sits below it), and
tests/agent/test_detector_registry.py holds each to the catalogue.

Every verdict is three-valued: True, False, or None when the inputs cannot tell. Conditions combine with
Kleene logic (all_of), so one input that rules a verdict out gives False even if another is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

ITL_FROM_ENGINE = "engine"  # the ITL histogram's buckets, as the engine exports them
ITL_FROM_PROXY = "proxy"  # the exact gaps between tokens, as the client-side proxy relayed them
ITL_SOURCES = (ITL_FROM_ENGINE, ITL_FROM_PROXY)

Verdict = bool | None


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


# -- Kleene logic over three-valued conditions ---------------------------------------------------------

def all_of(*conditions: Verdict) -> Verdict:
    """Kleene AND: False if any is False, else None if any is None, else True."""
    if any(c is False for c in conditions):
        return False
    if any(c is None for c in conditions):
        return None
    return True


def at_least(value: float | None, bound: float) -> Verdict:
    return None if value is None else value >= bound


def above(value: float | None, bound: float) -> Verdict:
    return None if value is None else value > bound


def below(value: float | None, bound: float) -> Verdict:
    return None if value is None else value < bound


# Bucket edges are decimal: 0.3 / 0.1 is 2.9999999999999996 in binary, and must count as 3x.
RATIO_SLACK = 1e-9


def over_median(recent: float | None, median: float | None) -> float | None:
    """A recent value over its median; None when either is unknown or the median is not positive."""
    if recent is None or median is None or median <= 0.0:
        return None
    return recent / median


def batch_fraction(running: float | None, batch_max: float | None) -> float | None:
    """running / the batch cap; None where either is unknown or the cap is not positive."""
    if running is None or batch_max is None or batch_max <= 0.0:
        return None
    return running / batch_max


# -- the declaration -----------------------------------------------------------------------------------

# What a knob must be: above 1, in (0, 1], or at least 0 (checked in that order: with two bad knobs, the
# message names the one it always named).
ABOVE_ONE, UNIT, NONNEG = "above 1", "(0, 1]", ">= 0"
CHECKS = (ABOVE_ONE, UNIT, NONNEG)


@dataclass(frozen=True, slots=True)
class Knob:
    """One threshold of a detector (`rooflight run --detector NAME=VALUE`), with its default and why."""

    name: str
    default: float
    check: str  # one of CHECKS
    why: str  # how the default was chosen (docs/physics.md's worked numbers)

    def problem(self, value: float) -> str | None:
        """What is wrong with `value` for this knob, or None."""
        if self.check == ABOVE_ONE and not value > 1.0:
            return f"{self.name} must be above 1 (got {value})"
        if self.check == UNIT and not 0.0 < value <= 1.0:
            return f"{self.name} must be in (0, 1] (got {value})"
        if self.check == NONNEG and not value >= 0.0:
            return f"{self.name} must be >= 0 (got {value})"
        return None


@dataclass(frozen=True, slots=True)
class Series:
    """One exported series per engine series (labels target, engine, model, rank, then `labels`)."""

    metric: str
    help: str
    unit: str = ""
    labels: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Value:
    """A number the verdict carries beside its flag (the Verdicts field `attr`, read from the inputs), exported
    as a gauge where it is zero or more, shown on the status page and in /api/v1/snapshot."""

    attr: str
    series: Series
    read: Callable[[DetectorInputs], float | None]


@dataclass(frozen=True, slots=True)
class Choice:
    """Which of `choices` the verdict's field `attr` names (read from the inputs): one series per choice
    (`series.labels`[0] = the choice), 1 for the one named and 0 for the others; `default` where none is."""

    attr: str
    series: Series
    choices: tuple[str, ...]
    default: str
    read: Callable[[DetectorInputs], str | None]


@dataclass(frozen=True, slots=True)
class GaugeAlert:
    """The alert the rule generator renders over the detector's 0/1 gauge (rules/alerts.py): true for at
    least `min_fraction` of `window`, for `for_`, at `severity` (the last two settings of `rooflight rules`:
    `--<flag>-for`, `--<flag>-severity`, and of the Helm chart); its value is `over` of `metric` across the
    window (e.g. the peak ITL inflation), and it links to dashboard `board`."""

    summary: str
    over: str  # a PromQL *_over_time function
    metric: str
    board: str
    window: str = "10m"
    min_fraction: float = 0.5
    for_: str = "10m"
    severity: str = "warning"
    flag: str | None = None  # the `rooflight rules` flags' stem; None: the key with dashes


@dataclass(frozen=True, slots=True)
class Panel:
    """The detector's line in a dashboard panel: the panel's board and title, the line's legend after the
    series' own (pod, model, rank), and its query's refId (which orders the lines)."""

    board: str
    title: str
    legend: str
    ref: str


def runbook_anchor(alert: str) -> str:
    """GitHub's anchor of an alert's heading in docs/runbooks.md (`## RooflightEngineStalled`)."""
    return alert.lower()


@dataclass(frozen=True)
class Detector:
    key: str  # the Verdicts field holding the verdict (True, False, None = cannot tell)
    judge: Callable[[DetectorInputs, Any], Verdict]  # pure: (inputs, DetectorThresholds) -> verdict
    title: str
    sentence: str  # the status page's explanation: one sentence, ending with a full stop
    flag: Series  # the 0/1 gauge
    alert: str  # the alert on-call gets for it (its runbook section is the alert's name)
    order: int  # its place on the page, in the catalogue and on /metrics, lowest first
    rule: GaugeAlert | None = None  # None: the alert is another detector's, or written in a rule module
    alert_note: str = ""  # where that alert is written (markdown), for docs/detectors.md
    knobs: tuple[Knob, ...] = ()
    values: tuple[Value, ...] = ()
    choice: Choice | None = None
    panel: Panel | None = None
    nvtx: str | None = None  # the NVTX mark of a rising edge, None for no mark

    @property
    def runbook_anchor(self) -> str:
        return runbook_anchor(self.alert)

    def exported(self) -> tuple[Series, ...]:
        """Every series the detector exports: the flag, its values, its choice."""
        return (self.flag, *(v.series for v in self.values), *((self.choice.series,) if self.choice else ()))
