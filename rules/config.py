"""The one config the Prometheus rules are generated from, the way monitoring mixins keep `_config`.

Selectors, the topology labels every rule keeps (cluster, namespace, pod, instance, job by default),
SLO thresholds and objectives (per model where one model needs its own), the client-side goodput
objective, burn-rate windows, each detector alert's `for` and severity (its declaration's by default),
the low-MBU threshold, the agent windows the capacity rules read, the agent's own scrape job
(meta-monitoring), the runbook and Grafana base URLs and the PrometheusRule's `release` label all live
here, so a user's
`rooflight rules --ttft-threshold 1 --agent-selector 'job="rooflight"'` and the checked-in YAML come
from the same code. Histogram names and bucket edges are config too: SGLang and TRT-LLM users point the
SLOs at their own histograms, and the generator refuses a threshold that is not a bucket edge.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

from rooflight.agent.config.rules_settings import SEVERITIES
from rooflight.agent.errors import ConfigError
from rooflight.agent.signals.detectors import detectors
from rooflight.collectors import engines

# The engine whose families the checked-in rules read (`rooflight rules --engine` picks another), as
# collectors/engines.py names it. Its histogram names, bucket edges and request counters are its adapter's
# (collectors/registry.py, ServiceFamilies): the rules ask it, they never spell an engine or its families.
DEFAULT_ENGINE = engines.SERVICE_DEFAULT
# The default SLO targets; each engine's threshold is its largest bucket edge at or below the target
# (vLLM: 2.5 s and 0.1 s, SGLang: 2 s and 0.1 s), since a threshold must be an edge.
TTFT_TARGET_SECONDS = 2.5
ITL_TARGET_SECONDS = 0.1

# What Prometheus attaches to every scrape on Kubernetes (PodMonitor/ServiceMonitor: namespace, pod,
# instance, job) plus `cluster`, the label Thanos, Mimir and kube-prometheus-stack use across clusters.
TOPOLOGY_LABELS = ("cluster", "namespace", "pod", "instance", "job")
REPLICA_LABELS = ("pod", "instance")
# The agent's own series labels: never a topology label (they are kept anyway, named in the rules).
RESERVED_LABELS = ("target", "engine", "model", "rank", "phase", "slo")  # slo: the proxy's goodput counters

# Grafana dashboards the alerts link to (`dashboard_url`), by their uid (the UID of dashboards/*.py).
DASHBOARD_UIDS = {
    "overview": "rooflight-overview",
    "kv-batch": "rooflight-kv-batch",
    "roofline": "rooflight-roofline",
    "gpu": "rooflight-gpu",
}
# The dashboards' variables that filter by a label of the same name (dashboards/panels.py), in their order.
DASHBOARD_VARIABLES = ("cluster", "namespace", "job", "pod", "instance", "target", "model", "rank")

_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
_DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w|y)")
_DURATION_UNITS = {"y": 365 * 86400.0, "w": 7 * 86400.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
MAX_DURATION = "10y"  # longer than any window, `for` or memory a rule has a use for (Prometheus's own ends at 292y)
MAX_DURATION_SECONDS = 10 * _DURATION_UNITS["y"]
# A PromQL label matcher (label, operator, a quoted value) and a list of them, as written between a selector's
# braces; a metric name (prometheus.io/docs/concepts/data_model).
_MATCHER = r"""[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=~|!~|!=|=)\s*(?:"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`[^`]*`)"""
_MATCHERS = re.compile(rf"^\s*(?:{_MATCHER}(?:\s*,\s*{_MATCHER})*)?\s*$")
METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
# A model name that may get its own SLO threshold: what serving engines accept as a served model name,
# and nothing that needs escaping in a PromQL string, a Go template or a Helm value.
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$")
_BASE_URL = re.compile(r"^https?://[^\s\"'{}<>]+[^/\s\"'{}<>]$")


def hold(config: "RulesConfig") -> dict[str, str]:
    """The down and stall alerts' `keep_firing_for`, or nothing where the config leaves it out."""
    return {"keep_firing_for": config.keep_firing_for} if config.keep_firing_for else {}


def check_duration(value: str, what: str) -> str:
    """A Prometheus duration (`5m`, `1h30m`: units from the largest, each once) of more than zero and at most
    MAX_DURATION; ConfigError otherwise (`0s` rendered `absent_over_time(...[0s])`, which Prometheus refuses,
    and `99999999999y` one past what it parses)."""
    if not isinstance(value, str) or not _DURATION.match(value):
        raise ConfigError(f"{what}: {value!r} is not a Prometheus duration like 5m or 1h")
    parts = _DURATION_PART.findall(value)
    order = [list(_DURATION_UNITS).index(unit) for _, unit in parts]
    if order != sorted(set(order)):
        raise ConfigError(f"{what}: {value!r}: write each unit once, the largest first, e.g. 1h30m")
    total = sum(int(number) * _DURATION_UNITS[unit] for number, unit in parts)
    if total <= 0:
        raise ConfigError(f"{what}: {value!r} is zero; write a duration of more than zero, e.g. 5m")
    if total > MAX_DURATION_SECONDS:
        raise ConfigError(f"{what}: {value!r} is longer than {MAX_DURATION}; write at most {MAX_DURATION}")
    return value


def check_matchers(value: str, what: str, *, required: bool = False) -> str:
    """Label matchers as written between a selector's braces (`job="rooflight", namespace=~"llm-.*"`), without
    the braces; ConfigError otherwise (`{job="x"` was spliced into every rule as given: invalid PromQL)."""
    if not isinstance(value, str) or not _MATCHERS.match(value) or (required and not value.strip()):
        raise ConfigError(f"{what}: {value!r} is not label matchers; write e.g. job=\"rooflight\" or "
                          "job=\"rooflight\", namespace=~\"llm-.*\" (no braces, each value quoted)")
    return value


def check_metric_name(value: str, what: str) -> str:
    """A Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*); ConfigError otherwise."""
    if not isinstance(value, str) or not METRIC_NAME.match(value):
        raise ConfigError(f"{what}: {value!r} is not a Prometheus metric name; write letters, digits, _ and : only,"
                          " not starting with a digit, e.g. engine:time_to_first_token_seconds")
    return value


def _check_severity(value: str, what: str) -> None:
    if value not in SEVERITIES:
        raise ConfigError(f"{what}: severity must be one of {', '.join(SEVERITIES)} (got {value!r})")


@dataclass(frozen=True)
class BurnWindow:
    """One row of the SRE workbook's multi-window multi-burn-rate table."""

    long: str
    short: str
    factor: float  # burn rate: error ratio / (1 - objective)
    for_: str
    severity: str  # critical pages, warning tickets

    def __post_init__(self) -> None:
        check_duration(self.long, "burn window")
        check_duration(self.short, "burn window")
        check_duration(self.for_, "burn window for")
        _check_severity(self.severity, "burn window")
        if not self.factor > 0:
            raise ConfigError(f"burn factor must be positive (got {self.factor})")


# 30-day budget: 2% spent in 1h or 5% in 6h pages; 10% in 1d or 3d tickets (sre.google/workbook/alerting-on-slos).
SRE_WORKBOOK_WINDOWS = (
    BurnWindow("1h", "5m", 14.4, "2m", "critical"),
    BurnWindow("6h", "30m", 6.0, "15m", "critical"),
    BurnWindow("1d", "2h", 3.0, "1h", "warning"),
    BurnWindow("3d", "6h", 1.0, "3h", "warning"),
)


@dataclass(frozen=True)
class LatencySLO:
    """"`objective` of observations of `histogram` are at most `threshold_seconds`", from the engine's buckets."""

    name: str  # short id used in rule names and the `slo` label: ttft, itl
    alert: str
    title: str  # human words for annotations
    histogram: str  # base name; the rules read <histogram>_bucket and <histogram>_count
    selector: str
    threshold_seconds: float
    objective: float
    buckets: tuple[float, ...]  # the engine's known edges; () = unknown, the runtime guard still applies
    # (model, threshold_seconds): models held to their own threshold (a 70B model's TTFT is not an 8B's).
    # Kept sorted by model, the order Helm's `range` walks a map in, so chart and CLI print the same rules.
    by_model: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        check_metric_name(self.histogram, f"{self.name} histogram")
        check_matchers(self.selector, f"{self.name} selector")
        if not 0.0 < self.objective < 1.0:
            raise ConfigError(f"{self.name} objective must be in (0, 1) (got {self.objective})")
        self._check_threshold(self.threshold_seconds, "threshold")
        models = [model for model, _ in self.by_model]
        if len(set(models)) != len(models):
            raise ConfigError(f"{self.name}: a model is given two thresholds ({', '.join(models)})")
        for model, threshold in self.by_model:
            if not _MODEL_NAME.match(model):
                raise ConfigError(
                    f"{self.name}: model {model!r} cannot get its own threshold: letters, digits and . _ : / @ + - only"
                )
            self._check_threshold(threshold, f"threshold for {model}")
        object.__setattr__(self, "by_model", tuple(sorted((m, float(t)) for m, t in self.by_model)))

    def _check_threshold(self, threshold: float, what: str) -> None:
        if not (threshold > 0 and math.isfinite(threshold)):
            raise ConfigError(f"{self.name} {what} must be a positive number of seconds")
        if self.buckets and not any(math.isclose(threshold, b) for b in self.buckets):
            edges = ", ".join(f"{b:g}" for b in self.buckets)
            raise ConfigError(
                f"{self.name} {what} {threshold:g}s is not a bucket edge of {self.histogram} "
                f"({edges}); a missing le never matches and the SLO alert would silently never fire. "
                "Pick an edge, or add one to the engine (vLLM: --custom-histogram-buckets) and declare the "
                "engine's edges here."
            )

    @property
    def budget(self) -> float:
        return 1.0 - self.objective


@dataclass(frozen=True)
class DetectorAlert:
    """An alert over one of the agent's 0/1 detector gauges: true for `min_fraction` of `window`, for `for_`."""

    window: str
    min_fraction: float
    for_: str
    severity: str = "warning"

    def __post_init__(self) -> None:
        check_duration(self.window, "detector window")
        check_duration(self.for_, "detector for")
        _check_severity(self.severity, "detector alert")
        if not 0.0 < self.min_fraction <= 1.0:
            raise ConfigError(f"detector min_fraction must be in (0, 1] (got {self.min_fraction})")


def declared_detector_alerts() -> tuple[tuple[str, DetectorAlert], ...]:
    """Each detector's gauge alert as the detector declares it (agent/signals/detectors/), by its key."""
    return tuple((d.key, DetectorAlert(r.window, r.min_fraction, r.for_, r.severity))
                 for d in detectors() if (r := d.rule) is not None)


def service_families(engine: str) -> engines.ServiceFamilies:
    """The families of `engine` the rules read; ConfigError for an engine whose families they don't know."""
    try:
        families = engines.adapter(engine).SERVICE_FAMILIES
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if families is None:
        raise ConfigError(f"the rules read no {engine} families yet; engines with SLO histograms: {', '.join(slo_engines())}")
    return families


def slo_engines() -> tuple[str, ...]:
    """The engines whose histograms and request counters `rooflight rules --engine` can read."""
    return tuple(a.ENGINE for a in engines.adapters() if a.SERVICE_FAMILIES is not None)


def default_threshold(target: float, edges: tuple[float, ...]) -> float:
    """The largest bucket edge at or below `target`: the threshold an engine's histogram can judge."""
    return max((edge for edge in edges if edge <= target), default=target)


def ttft_slo(
    engine: str = DEFAULT_ENGINE, threshold_seconds: float | None = None, objective: float = 0.99,
    selector: str = "", by_model: tuple[tuple[str, float], ...] = (),
) -> LatencySLO:
    """The time-to-first-token SLO over `engine`'s own histogram; the default threshold is its edge of TTFT_TARGET_SECONDS."""
    histogram = service_families(engine).ttft
    return LatencySLO(
        "ttft", "RooflightTTFTBudgetBurn", "time to first token", histogram.name, selector,
        default_threshold(TTFT_TARGET_SECONDS, histogram.edges) if threshold_seconds is None else threshold_seconds,
        objective, histogram.edges, by_model,
    )  # fmt: skip


def itl_slo(
    engine: str = DEFAULT_ENGINE, threshold_seconds: float | None = None, objective: float = 0.99,
    selector: str = "", by_model: tuple[tuple[str, float], ...] = (),
) -> LatencySLO:
    """The inter-token latency SLO over `engine`'s own histogram; the default threshold is its edge of ITL_TARGET_SECONDS."""
    histogram = service_families(engine).itl
    return LatencySLO(
        "itl", "RooflightITLBudgetBurn", "inter-token latency", histogram.name, selector,
        default_threshold(ITL_TARGET_SECONDS, histogram.edges) if threshold_seconds is None else threshold_seconds,
        objective, histogram.edges, by_model,
    )  # fmt: skip


@dataclass(frozen=True)
class RulesConfig:
    """Everything the generator needs. Defaults are what ships in rules/*.yaml."""

    agent_selector: str = ""  # matchers for every rooflight_* series, e.g. 'job="rooflight"'
    # Labels Prometheus attaches to a scrape (service discovery, relabelling, a Thanos/Mimir tenant's
    # external labels). Two replicas' agents can export the same `target` and `model` (each sidecar
    # watches its own 127.0.0.1:8000), so only these tell them apart: every per-target aggregation and
    # join keeps them, as kubernetes-mixin keeps its clusterLabel. A label a series lacks is an empty
    # value in PromQL, so the defaults are harmless where there is no `cluster` or `pod`.
    topology_labels: tuple[str, ...] = TOPOLOGY_LABELS
    # The topology labels that tell replicas of one service apart. SLOs are the service's: they sum
    # over its replicas on purpose (aggregating these away) and keep the rest (cluster, namespace, job).
    replica_labels: tuple[str, ...] = REPLICA_LABELS
    # More labels your relabelling adds (region, tenant, ...); kept like the topology labels.
    extra_labels: tuple[str, ...] = ()
    slo_group_by: tuple[str, ...] = ("model_name",)
    # The engine's label that names the model, for per-model SLO thresholds (LatencySLO.by_model).
    slo_model_label: str = "model_name"
    ttft: LatencySLO = field(default_factory=ttft_slo)
    itl: LatencySLO = field(default_factory=itl_slo)
    burn_windows: tuple[BurnWindow, ...] = SRE_WORKBOOK_WINDOWS
    # Client-side goodput (rules/goodput.py): the share of judged requests that must meet every target of
    # each SLO the proxy is given (`--slo`); its burn-rate alerts use the same windows as TTFT and ITL.
    goodput_objective: float = 0.99
    # Availability (rules/availability.py): the engine's finish reasons counted as failures and the share
    # of finished requests that must end otherwise; the share of the proxy's inference requests that must
    # not be answered 5xx or cut by the upstream.
    # The engine's failed and finished requests as selectors (its adapter's ServiceFamilies; rooflight
    # rules --engine picks them: vLLM's finish counter by reason, SGLang's aborted and processed counters).
    requests_failed: str = field(default_factory=lambda: service_families(DEFAULT_ENGINE).requests_failed)
    requests_finished: str = field(default_factory=lambda: service_families(DEFAULT_ENGINE).requests_finished)
    # The API server's HTTP responses to inference routes by status class, where the engine counts them (vLLM's):
    # the clients' availability SLO reads their 5xx where no Rooflight proxy stands in front. The same selector
    # for every --engine: where an engine has no such family, that branch of the SLO reads nothing.
    http_requests: str = field(default_factory=lambda: service_families(DEFAULT_ENGINE).http_requests)
    # The agent's `engine` label of the engine whose histograms the SLOs read (rooflight rules --engine):
    # where the agent watches such an engine and Prometheus holds none of its histograms, the SLOs are blind.
    slo_engine: str = DEFAULT_ENGINE
    request_error_objective: float = 0.99
    client_error_objective: float = 0.999
    # Every burn-rate row (latency, goodput, availability) fires only where its long window saw at least
    # this many requests: two slow or failed requests in a quiet hour are not a burn rate.
    slo_min_requests: int = 20
    # ... and at least this many bad events (slow first tokens or tokens, failed requests): four slow
    # requests in a quiet night hour are a ratio of 17%, not a reason to wake anyone.
    slo_min_bad_events: int = 10
    bucket_guard_for: str = "15m"
    rate_window: str = "5m"  # for the recording rules (MBU, MFU, tokens/s)
    # Each detector's gauge alert (rules/alerts.py) by the detector's key: its thresholds as the detector
    # declares them (agent/signals/detectors/), its `for` and severity settings (`rooflight rules --hol-for`).
    detector_alerts: tuple[tuple[str, DetectorAlert], ...] = field(default_factory=lambda: declared_detector_alerts())
    low_mbu_threshold: float = 0.3  # a healthy decode streams 60-80% of peak bandwidth
    low_mbu_for: str = "30m"
    low_mbu_min_running: float = 1.0  # decode must have been busy the whole rate window
    # An engine down (rules/outage.py): its pod's ticket once its engine failed every sample for at least
    # `engine_down_share` of `engine_down_window` (a crash loop's minutes up in between do not reset it; one
    # restart that reloads in a few minutes stays under it); the model's page once more than
    # `model_down_share` of its engines are down, for `engine_down_for`. Both keep firing for
    # `keep_firing_for` after their condition clears, so a crash loop's minute up neither resolves nor
    # re-sends them. `engine_memory`: how far back Prometheus's memory of a pod's model and of its engine
    # having served reaches (an agent restarted during an outage has forgotten both; Prometheus has not).
    engine_down_for: str = "2m"
    engine_down_window: str = "15m"
    engine_down_share: float = 0.5
    model_down_share: float = 0.5
    keep_firing_for: str = "10m"  # "" renders no keep_firing_for (Debian 12's vmalert 1.79 refuses the field)
    engine_memory: str = "6h"
    # How long an engine may stay starting (not one good sample since the agent started: loading weights)
    # before RooflightEngineStartTimeout: above the slowest model load, as the Helm chart's startup probe.
    engine_start_budget: str = "30m"
    # RooflightEngineStalled (rules/health.py): requests held and no token or step for the window, then `for`.
    engine_stalled_window: str = "2m"
    engine_stalled_for: str = "1m"
    # GPU health (rules/health.py): the window XID and ECC increases, throttling and temperature are read
    # over; the share of it spent in thermal or power-brake slowdown; the temperature held throughout it.
    gpu_health_window: str = "10m"
    gpu_throttle_share: float = 0.25
    gpu_temperature_celsius: float = 85.0
    gpu_down_for: str = "5m"
    gpu_lost_for: str = "1m"  # RooflightGPULost: NVML says the GPU fell off the bus (rooflight_gpu_up 0)
    source_down_for: str = "15m"  # any other source (process, ...): a gap in the data, not an outage
    # Meta-monitoring: the agent's own scrape, by Prometheus's `up`. The chart and the kustomize base set
    # job="rooflight" on the agent's endpoint (not the engine's), the compose stack names its job so.
    agent_job_selector: str = 'job="rooflight"'
    agent_down_for: str = "5m"
    agent_absent_for: str = "15m"
    # The agent's shortest and longest --windows: the head-of-line alert quotes ITL p99 over the first
    # (the stall) and p50 over the second (its median), the definition docs/metrics.md gives.
    itl_short_window: str = "10s"
    itl_long_window: str = "5m"
    # Capacity rules (rules/capacity.py): the agent's --windows entries they read. The autoscaling signal
    # is the saturation over `saturation_window` (its time-weighted means smooth step-to-step noise; the
    # rule's max_over_time over the same span holds a peak that long before a scale-in); the capacity per
    # group that `groups needed` divides by is read over `capacity_window`.
    saturation_window: str = "1m"
    capacity_window: str = "5m"
    runbook_base_url: str = "https://github.com/rooflight/rooflight/blob/main/docs/runbooks.md"
    # Grafana serving dashboards/ (the compose stack's by default); each alert links the dashboard that
    # shows its cause, filtered to the alert's labels (`dashboard_url`).
    dashboard_base_url: str = "http://localhost:3000"
    # The fleet's central ruler (rules/fleet.py): the topology label that names a cluster (an external label
    # of each cluster's Prometheus) and how long its agents may be silent before RooflightClusterAbsent.
    cluster_label: str = "cluster"
    cluster_absent_for: str = "10m"
    rule_name: str = "rooflight"  # PrometheusRule metadata.name and the group name prefix
    release: str = ""  # kube-prometheus-stack selects rules by `release: <helm release>`

    def __post_init__(self) -> None:
        if self.keep_firing_for:  # "" leaves it out: rulers that lack it (vmalert before 1.91)
            check_duration(self.keep_firing_for, "keep_firing_for")
        for duration, what in (
            (self.bucket_guard_for, "bucket_guard_for"),
            (self.rate_window, "rate_window"),
            (self.low_mbu_for, "low_mbu_for"),
            (self.engine_down_for, "engine_down_for"),
            (self.engine_down_window, "engine_down_window"),
            (self.engine_memory, "engine_memory"),
            (self.gpu_lost_for, "gpu_lost_for"),
            (self.engine_start_budget, "engine_start_budget"),
            (self.engine_stalled_window, "engine_stalled_window"),
            (self.engine_stalled_for, "engine_stalled_for"),
            (self.gpu_health_window, "gpu_health_window"),
            (self.gpu_down_for, "gpu_down_for"),
            (self.source_down_for, "source_down_for"),
            (self.agent_down_for, "agent_down_for"),
            (self.agent_absent_for, "agent_absent_for"),
            (self.itl_short_window, "itl_short_window"),
            (self.itl_long_window, "itl_long_window"),
            (self.saturation_window, "saturation_window"),
            (self.capacity_window, "capacity_window"),
            (self.cluster_absent_for, "cluster_absent_for"),
        ):
            check_duration(duration, what)
        for window, what in ((self.saturation_window, "saturation_window"), (self.capacity_window, "capacity_window")):
            if not re.match(r"^[0-9]+[a-z]+$", window):
                raise ConfigError(f"{what}: {window!r} must be one number and one unit (an agent --windows entry: 1m)")
        for url, what in ((self.runbook_base_url, "runbook_base_url"), (self.dashboard_base_url, "dashboard_base_url")):
            if not _BASE_URL.match(url):
                raise ConfigError(f"{what}: {url!r} must be an http(s) URL without a trailing slash")
        check_matchers(self.agent_selector, "agent_selector")
        if not _MATCHERS.match(self.agent_job_selector) or \
                not re.match(r"^\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*\"", self.agent_job_selector):
            raise ConfigError(
                f"agent_job_selector {self.agent_job_selector!r} must be label matchers such as job=\"rooflight\" "
                "(absent() needs at least one; an equality keeps its label on the alert)"
            )
        if not 0.0 < self.goodput_objective < 1.0:
            raise ConfigError(f"goodput_objective must be in (0, 1) (got {self.goodput_objective})")
        for objective, what in ((self.request_error_objective, "request_error_objective"),
                                (self.client_error_objective, "client_error_objective")):
            if not 0.0 < objective < 1.0:
                raise ConfigError(f"{what} must be in (0, 1) (got {objective})")
        if self.slo_min_requests < 1:
            raise ConfigError(f"slo_min_requests must be at least 1 (got {self.slo_min_requests})")
        if self.slo_min_bad_events < 1:
            raise ConfigError(f"slo_min_bad_events must be at least 1 (got {self.slo_min_bad_events})")
        for share, what in ((self.engine_down_share, "engine_down_share"), (self.model_down_share, "model_down_share")):
            if not 0.0 < share < 1.0:
                raise ConfigError(f"{what} must be in (0, 1) (got {share})")
        for selector, what in ((self.requests_failed, "requests_failed"), (self.requests_finished, "requests_finished"),
                               (self.http_requests, "http_requests")):
            if not re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})?$", selector):
                raise ConfigError(f"{what} {selector!r} must be a metric name with optional matchers")
        if not 0.0 < self.low_mbu_threshold < 1.0:
            raise ConfigError(f"low_mbu_threshold must be in (0, 1) (got {self.low_mbu_threshold})")
        if not 0.0 < self.gpu_throttle_share <= 1.0:
            raise ConfigError(f"gpu_throttle_share must be in (0, 1] (got {self.gpu_throttle_share})")
        if not 0.0 < self.gpu_temperature_celsius < 150.0:
            raise ConfigError(f"gpu_temperature_celsius must be in (0, 150) C (got {self.gpu_temperature_celsius})")
        if not self.slo_group_by:
            raise ConfigError("slo_group_by needs at least one label (model_name for vLLM)")
        if not self.burn_windows:
            raise ConfigError("at least one burn window is needed")
        labels = (*self.topology_labels, *self.replica_labels, *self.extra_labels, *self.slo_group_by, self.slo_model_label)
        for label in labels:
            if not re.match(r"^[a-zA-Z_][a-zA-Z0-9_]*$", label):
                raise ConfigError(f"{label!r} is not a Prometheus label name")
        if (self.ttft.by_model or self.itl.by_model) and self.slo_model_label not in self.slo_group_by:
            raise ConfigError(
                f"per-model SLO thresholds need {self.slo_model_label!r} in slo_group_by "
                f"(got {', '.join(self.slo_group_by)}): each model's errors must stay a series of their own"
            )
        clash = set(self.kept_labels) & set(RESERVED_LABELS)
        if clash:
            raise ConfigError(
                f"{', '.join(sorted(clash))}: the agent's own label(s), not a scrape's; "
                "they are always kept, list only the labels Prometheus adds"
            )
        if not re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", self.rule_name):
            raise ConfigError(f"rule_name {self.rule_name!r} must be a Kubernetes name (lower case, dashes)")

    def detector_alert(self, key: str) -> DetectorAlert:
        """The thresholds of detector `key`'s gauge alert: as set here, else as the detector declares them."""
        return dict(self.detector_alerts).get(key) or dict(declared_detector_alerts())[key]

    def with_detector_alert(self, key: str, **changes: Any) -> RulesConfig:
        """This config with detector `key`'s alert thresholds changed (`for_`, `severity`, ...)."""
        alerts = dict(self.detector_alerts)
        alerts[key] = replace(self.detector_alert(key), **changes)
        return replace(self, detector_alerts=tuple(alerts.items()))

    @property
    def kept_labels(self) -> tuple[str, ...]:
        """Topology and extra labels, in order, without repeats: kept by every per-target rule."""
        return tuple(dict.fromkeys((*self.topology_labels, *self.extra_labels)))

    @property
    def service_labels(self) -> tuple[str, ...]:
        """The kept labels minus the replica ones: where a service runs, kept by its SLOs."""
        return tuple(label for label in self.kept_labels if label not in self.replica_labels)

    def runbook_url(self, alert: str) -> str:
        """GitHub's anchor of the alert's heading in docs/runbooks.md."""
        return f"{self.runbook_base_url}#{alert.lower()}"

    def dashboard_url(self, board: str) -> str:
        """The dashboard's address, without its variables (rules/templates.py dashboard_link adds them)."""
        return f"{self.dashboard_base_url}/d/{DASHBOARD_UIDS[board]}"
