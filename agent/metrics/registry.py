"""Every detector, and every number the status page shows, declared once: what everything that shows one reads.

One `Detector` entry says what a detector is called (`key`, the `Verdicts` attribute its verdict sits
in), how people see it (title and sentence on the status page), the series it exports (its 0/1 gauge,
plus any number or source its verdict carries), the alert and runbook section on-call gets, the
dashboard panel that draws it and the NVTX mark a rising edge leaves in a profile. Readers:

- /metrics (agent/metrics/exposition.py) and its catalog rows (agent/metrics/catalog.py, docs/metrics.md);
- /api/v1/status and the status page (agent/serve/status.py), /api/v1/snapshot (agent/serve/server.py);
- the alerts (rules/alerts.py renders a detector's `GaugeAlert`; rules/health.py names its own from here);
- the dashboards (dashboards/panels.py, `detector_queries`, for every board's detector panel);
- the runbook check (tests/agent/test_detector_registry.py: every alert here has a section in docs/runbooks.md);
- the sampling loop's NVTX marks (`nvtx_marks()`).

A `Family` does the same, more briefly, for a derived number: the status page's name for it, its series,
and the alert that reads it (the low decode MBU alert, rules/alerts.py).

It sits with the metric names it refers to (agent/metrics), above the detectors' logic (agent/signals),
so every reader, the sampling loop included, imports it downwards.

Plain data and small functions only: the detectors' logic is in agent/signals/detectors.py, the order
of DETECTORS is the order of the page, the catalog and /metrics. docs/detectors.md ("Adding a
detector") says which files a new detector touches.
"""

from __future__ import annotations

from dataclasses import dataclass

from rooflight.agent.metrics import names as n
from rooflight.agent.signals.detectors import ITL_FROM_ENGINE, ITL_SOURCES


@dataclass(frozen=True, slots=True)
class Series:
    """One exported series per engine series (labels target, engine, model, rank, then `labels`)."""

    metric: str
    help: str
    unit: str = ""
    labels: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Value:
    """A number the verdict carries beside its flag (the `Verdicts` attribute `attr`), exported as a gauge
    where it is zero or more, shown on the status page and in /api/v1/snapshot."""

    attr: str
    series: Series


@dataclass(frozen=True, slots=True)
class Choice:
    """Which of `choices` the verdict's attribute `attr` names: one series per choice (`series.labels`[0]
    = the choice), 1 for the one named and 0 for the others; `default` where the verdict names none."""

    attr: str
    series: Series
    choices: tuple[str, ...]
    default: str


@dataclass(frozen=True, slots=True)
class GaugeAlert:
    """An alert rules/alerts.py renders over the detector's 0/1 gauge: true for a share of a window (the
    RulesConfig field named like the detector's key, else rules/alerts.py's default thresholds), its value
    `over` of `metric` across that window (e.g. the peak ITL inflation), linking to dashboard `board`."""

    summary: str
    over: str  # a PromQL *_over_time function
    metric: str
    board: str


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


@dataclass(frozen=True, slots=True)
class Detector:
    key: str  # the Verdicts attribute holding the verdict (True, False, None = cannot tell)
    title: str
    sentence: str  # the status page's explanation: one sentence, ending with a full stop
    flag: Series  # the 0/1 gauge
    alert: str  # the alert on-call gets for it (its runbook section is the alert's name)
    rule: GaugeAlert | None = None  # None: the alert is another detector's, or written in its own module
    values: tuple[Value, ...] = ()
    choice: Choice | None = None
    panel: Panel | None = None
    nvtx: str | None = None  # the NVTX mark of a rising edge, None for no mark

    @property
    def runbook_anchor(self) -> str:
        return runbook_anchor(self.alert)

    def exported(self) -> tuple[Series, ...]:
        """Every series the detector exports, in catalog order: the flag, its values, its choice."""
        return (self.flag, *(v.series for v in self.values), *((self.choice.series,) if self.choice else ()))


KV_BATCH_PANEL = "What limits the batch (detectors)"

HEAD_OF_LINE = Detector(
    key="head_of_line",
    title="Head-of-line blocking",
    sentence="A long prompt prefilled whole stalls every in-flight decode: the worst ITL inflated against its "
             "recent median while prompts shared the batch.",
    flag=Series(n.HEAD_OF_LINE_BLOCKING, "1 while the ITL tail inflates against its recent median with prefill "
                                         "work in the batch."),
    alert="RooflightHeadOfLineBlocking",
    rule=GaugeAlert("Prefill work is stalling the decode batch (head-of-line blocking).", "max_over_time",
                    n.ITL_INFLATION, "overview"),
    values=(Value("itl_inflation", Series(
        n.ITL_INFLATION, "The worst ITL since the agent's previous sample / its own recent median (of that worst, "
        "over the longest window); the worst is the upper bound of the highest ITL bucket that gained "
        "observations, or the exact worst gap between tokens where the proxy judged.", "ratio")),),
    choice=Choice("itl_source", Series(
        n.HEAD_OF_LINE_SOURCE, "Which ITL judged head-of-line (one series per source, 1 for the one that did): "
        "proxy = the exact gaps between tokens the client-side proxy relayed (rooflight run --proxy-listen, a "
        "target with one series, once 30 s of them are known), engine = the engine's ITL histogram buckets.",
        labels=("source",)), ITL_SOURCES, ITL_FROM_ENGINE),
    panel=Panel("overview", "Head-of-line detector", "", "A"),
    nvtx="head-of-line stall",
)

CAPACITY_CAPPED = Detector(
    key="capacity_capped",
    title="Batch capacity-capped (KV wall)",
    sentence="The KV cache is at the wall: occupancy near full, preemptions climbing, requests waiting; "
             "memory, not the scheduler, binds the batch.",
    flag=Series(n.BATCH_CAPACITY_CAPPED, "1 while the batch is capped by KV capacity: occupancy pinned near 1, "
                                         "preemptions climbing, requests waiting."),
    alert="RooflightBatchCapacityCapped",
    rule=GaugeAlert("The batch is capped by KV-cache capacity: occupancy pinned, preemptions climbing, requests "
                    "waiting.", "avg_over_time", n.KV_USAGE, "kv-batch"),
    panel=Panel("kv-batch", KV_BATCH_PANEL, "capacity-capped", "A"),
    nvtx="capacity-capped batch",
)

ADMISSION_BOUND = Detector(
    key="admission_bound",
    title="Batch admission-bound",
    sentence="Requests wait while the batch sits well below its cap and KV has room: something upstream "
             "of the batch binds it.",
    flag=Series(n.BATCH_ADMISSION_BOUND, "1 while requests wait although the batch is well below its cap and KV "
                                         "has room."),
    alert="RooflightBatchAdmissionBound",
    rule=GaugeAlert("Requests are queueing while the batch and the KV cache have room (admission-bound).",
                    "avg_over_time", n.REQUESTS_WAITING, "kv-batch"),
    panel=Panel("kv-batch", KV_BATCH_PANEL, "admission-bound", "C"),
    nvtx="admission-bound batch",
)

AT_CONFIGURED_MAX = Detector(
    key="at_configured_max",
    title="Batch at its configured maximum",
    sentence="The batch reached its configured cap (max_num_seqs) while KV has room: a config lever, "
             "not the hardware.",
    flag=Series(n.BATCH_AT_CONFIGURED_MAX, "1 while running = the configured batch cap with KV room: a config "
                                           "lever, not the memory wall."),
    alert=ADMISSION_BOUND.alert,  # no alert of its own: the runbook's admission-bound section covers it
    panel=Panel("kv-batch", KV_BATCH_PANEL, "at configured max", "B"),
)

ENGINE_STALLED = Detector(
    key="engine_stalled",
    title="Engine stalled",
    sentence="Requests are held and the engine has run no step and produced no token for half a minute while its "
             "metrics still answer: hung, not slow.",
    flag=Series(n.ENGINE_STALLED, "1 while requests were held (running or waiting) through the last stall_seconds "
                                  "(30 s) and the engine ran no step and produced no token in them, its /metrics "
                                  "answering: hung, not slow."),
    alert="RooflightEngineStalled",  # rules/health.py: the same condition over the counters, over minutes
)

DETECTORS: tuple[Detector, ...] = (HEAD_OF_LINE, CAPACITY_CAPPED, ADMISSION_BOUND, AT_CONFIGURED_MAX, ENGINE_STALLED)


@dataclass(frozen=True, slots=True)
class Family:
    """A number the agent exports that the status page shows (`key`: its name there, which links it to its
    series), with the alert that reads it and the dashboard that alert links to, if any."""

    key: str
    metric: str
    alert: str | None = None
    board: str | None = None


MBU = Family("mbu", n.MBU, alert="RooflightLowDecodeMBU", board="roofline")

# In the order the page lists them; a detector's values (head_of_line's inflation) join them (page_metrics).
FAMILIES: tuple[Family, ...] = (
    MBU,
    Family("mfu", n.MFU),
    Family("tokens_per_second", n.TOKENS_PER_SECOND),
    Family("ttft", n.TTFT),
    Family("itl", n.ITL),
    Family("preemptions_per_second", n.PREEMPTIONS_PER_SECOND),
    Family("decode_intensity", n.DECODE_INTENSITY),
    Family("kv_usage_ratio", n.KV_USAGE),
    Family("running", n.REQUESTS_RUNNING),
    Family("waiting", n.REQUESTS_WAITING),
    Family("batch_max", n.BATCH_MAX_REQUESTS),
    Family("source_up", n.SOURCE_UP),
    Family("source_starting", n.SOURCE_STARTING),
    Family("source_last_success", n.SOURCE_LAST_SUCCESS),
)


def detectors() -> tuple[Detector, ...]:
    """Every detector, in the page's and the catalog's order (read at call time: a test may add one)."""
    return DETECTORS


def by_key(key: str) -> Detector:
    for d in DETECTORS:
        if d.key == key:
            return d
    raise KeyError(f"no detector {key!r} in agent/metrics/registry.py")


def verdict_keys() -> tuple[str, ...]:
    """The Verdicts attributes that hold a detector's verdict, in order."""
    return tuple(d.key for d in DETECTORS)


def nvtx_marks() -> tuple[tuple[str, str], ...]:
    """(verdict key, NVTX mark) of each detector whose rising edge the sampling loop marks in a profile."""
    return tuple((d.key, d.nvtx) for d in DETECTORS if d.nvtx)


def families() -> tuple[Family, ...]:
    return FAMILIES


def page_metrics() -> dict[str, str]:
    """The series of each number the status page shows, by the page's name for it."""
    return {**{f.key: f.metric for f in FAMILIES}, **{v.attr: v.series.metric for d in DETECTORS for v in d.values}}


def alerts() -> tuple[str, ...]:
    """Every alert a detector or a family names, each once, in order: each needs a section in docs/runbooks.md."""
    named = [d.alert for d in DETECTORS] + [f.alert for f in FAMILIES if f.alert]
    return tuple(dict.fromkeys(named))


def gauge_alerts() -> tuple[Detector, ...]:
    """The detectors whose alert rules/alerts.py renders over their gauge."""
    return tuple(d for d in DETECTORS if d.rule is not None)


def panel_lines(board: str, title: str) -> tuple[Detector, ...]:
    """The detectors drawn in one dashboard panel, by their lines' refIds."""
    lines = [d for d in DETECTORS if d.panel is not None and (d.panel.board, d.panel.title) == (board, title)]
    return tuple(sorted(lines, key=lambda d: d.panel.ref if d.panel else ""))
