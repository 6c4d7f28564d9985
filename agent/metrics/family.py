"""What one exported family is, and where in the Snapshot its value is read: the type of every declaration in
agent/metrics/names.py, and the scopes the exposition walks.

A family belongs to one scope, the part of the Snapshot it is read from, and its series are labelled by
that scope's labels (SCOPE_LABELS) and then its own (`by`). Its `value` is a pure function of one thing of
that scope (a Health, a SeriesView, a WindowValues, ...) giving None (no series), one number, or a mapping
from its own labels' values (a str, or a tuple for several labels) to numbers: one series each. It may name
the field that carries its value in /api/v1/snapshot and /api/v1/status (`api`), and the status page's name
for it (`page`), which the page uses to say which series a number is.

Absent means "cannot be derived here", never a made-up zero: a value that is None or not finite is not
exported, nor (where `nonneg`, the default of the engine's and the derived scopes) a negative one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


@dataclass(frozen=True, slots=True)
class MetricDef:
    """A family as the exposition and the docs describe it (the proxy's catalog declares its own so)."""

    name: str  # as exposed (counters include _total; histograms without _bucket/_sum/_count)
    type: str  # gauge, counter or histogram (the proxy's)
    labels: tuple[str, ...]
    unit: str
    help: str

# The scopes, in the order the exposition walks them (agent/metrics/exposition.py); per engine series, its
# own families, then each window's, its settings, each window's capacity signals, then its verdicts.
AGENT = "agent"  # the agent itself: nothing to read
HEALTH = "health"  # one per source: a metrics.snapshot.Health
SERIES = "series"  # one per (target, model, rank): a signals.view.SeriesView
WINDOW = "window"  # one per window of a series: a signals.derive.WindowValues
SETTINGS = "settings"  # the engine's settings of a series (a SeriesView), as labels of an info family
SIGNALS = "signals"  # one per window of a series: a signals.headroom.WindowSignals
VERDICTS = "verdicts"  # the detectors' verdicts of a series (signals.detectors.Verdicts)
TARGET = "target"  # one per target with constants: a metrics.snapshot.TargetView
MODEL = "model"  # one per (target, model) with model constants: a ModelRow
GPU = "gpu"  # one per GPU exported, or one row saying none was detected: a GpuRow
TARGET_GPU = "target_gpu"  # one per target with GPUs: a TargetGpuRow
PROCESS = "process"  # one per target's engine process tree: a collectors.samples.ProcessSample
SCOPES = (AGENT, HEALTH, SERIES, WINDOW, SETTINGS, SIGNALS, VERDICTS, TARGET, MODEL, GPU, TARGET_GPU, PROCESS)

SERIES_LABELS = ("target", "engine", "model", "rank")
SCOPE_LABELS: Mapping[str, tuple[str, ...]] = {
    AGENT: (), HEALTH: ("source", "target"), SERIES: SERIES_LABELS, WINDOW: (*SERIES_LABELS, "window"),
    SETTINGS: SERIES_LABELS, SIGNALS: (*SERIES_LABELS, "window"), VERDICTS: SERIES_LABELS, TARGET: ("target",),
    MODEL: ("target", "model"), GPU: ("gpu", "uuid"), TARGET_GPU: ("target",), PROCESS: ("target",),
}
# Scopes whose values are the engine's or derived from it: a negative one is no reading.
NONNEG_SCOPES = (SERIES, WINDOW, SIGNALS, VERDICTS)

Value = Callable[[Any], Any]  # the thing of its scope -> None, a number, or {label value(s): number}


@dataclass(frozen=True, slots=True)
class Family(MetricDef):
    """One exported family: what MetricDef says of it, and where its value is read."""

    scope: str = AGENT
    value: Value = lambda _: None
    sort: bool = False  # a mapping's series in the order of its keys (else in the order the snapshot holds them)
    nonneg: bool = True  # a negative value is not exported
    info: bool = False  # the value maps further label names to values (an info family whose labels vary)
    api: str | None = None  # its field in /api/v1/snapshot and /api/v1/status
    page: str | None = None  # the status page's name for it
    mapped: bool = field(init=False, default=False)  # labels of its own: its value is a mapping

    def __post_init__(self) -> None:
        object.__setattr__(self, "mapped", len(self.labels) > len(SCOPE_LABELS[self.scope]))

    def series(self, thing: Any) -> list[tuple[tuple[str, ...], float]]:
        """(its own label values, value) of each series it exports for `thing` (info families: none). On the
        scrape path: a list, not a generator, and no call per value."""
        value = self.value(thing)
        if value is None or self.info:
            return []
        nonneg = self.nonneg
        if not self.mapped:
            number = float(value)
            return [] if nonneg and number < 0 else [((), number)]
        out = []
        for key, item in sorted(value.items()) if self.sort else value.items():
            if item is not None and not (nonneg and item < 0):
                out.append((key if type(key) is tuple else (key,), float(item)))
        return out

    def raw(self, thing: Any) -> Any:
        """Its value as /api/v1/snapshot shows it: as derived, a mapping as a dict."""
        value = self.value(thing)
        return dict(value) if isinstance(value, Mapping) else value


class Declarations:
    """The families a module declares, in order: each call declares one and returns its name."""

    def __init__(self) -> None:
        self.families: list[Family] = []

    def __call__(self, scope: str, name: str, unit: str, help_: str, value: Value, *, by: tuple[str, ...] = (),
                 counter: bool = False, **options: Any) -> str:
        options.setdefault("nonneg", scope in NONNEG_SCOPES)
        self.families.append(Family(name, "counter" if counter else "gauge", (*SCOPE_LABELS[scope], *by), unit,
                                    help_, scope=scope, value=value, **options))
        return name
