"""Alerts on the agent's own series (detectors, low decode MBU, sources down) and on its scrape (meta).

Detector alerts are the detectors' own (agent/signals/detectors/): one per detector that declares a gauge
alert, in their order, with its summary, dashboard, thresholds, `for` and severity (RulesConfig's settings). They read the agent's 0/1 gauges (evaluated every second by the agent, sampled by each
scrape) as the fraction of a window they were true, so one flicker neither fires nor resets them. Each
alert's value is the number on-call needs first (peak ITL inflation, KV occupancy, queue length, MBU);
its description adds the absolute values behind it (seconds, tokens per step, preemptions/s, queue),
read with template queries for the very series that fired (rules/templates.py).
Every alert carries `severity` and the annotations `summary`, `description`, `runbook_url` and
`dashboard_url`: the Grafana dashboard that shows the cause, filtered to the alert's pod, target, model
and rank.

Joins are `on` the agent's labels plus the scrape's topology labels, so an alert fires for the replica
whose detector is true, not for every pod that exports the same target; its labels carry the pod and
instance, and its description names the replica (its `pod`, else its `instance`).

Meta-monitoring, in the monitoring-mixin way: the agent's own scrape is down (`up == 0`, per pod) or
missing altogether (`absent(up)`: the monitor is not selected, the job is misnamed), and a source other
than the engine (rules/outage.py) and NVML (which have their own alerts) stays down.
"""

from __future__ import annotations

from typing import Callable

from rooflight.agent.metrics import names
from rooflight.agent.signals.detectors import Detector, detectors
from rooflight.rules.config import DASHBOARD_VARIABLES, DetectorAlert, RulesConfig
from rooflight.rules.promql import labels, number, series
from rooflight.rules.recording import Rule, keep, mbu_record, rank_labels
from rooflight.rules.templates import SELF, dashboard_link, first_label, query_value, same

# Dashboard variables each kind of alert sets from its labels.
PER_TARGET = same(*DASHBOARD_VARIABLES)
PER_SOURCE = same("cluster", "namespace", "job", "pod", "instance", "target")
PER_SCRAPE = same("cluster", "namespace", "job", "pod", "instance")
Link = tuple[str, tuple[tuple[str, str], ...]]  # (dashboard, variables)


def _replica(before: str, after: str) -> str:
    """A Prometheus template naming the replica: `pod` on Kubernetes, else `instance`, else nothing."""
    return (
        f"{{{{ if $labels.pod }}}}{before}pod {{{{ $labels.pod }}}}{after}"
        f"{{{{ else if $labels.instance }}}}{before}instance {{{{ $labels.instance }}}}{after}{{{{ end }}}}"
    )


WHERE = "{{ $labels.target }} ({{ $labels.model }}, rank {{ $labels.rank }}" + _replica(", ", "") + ")"
SOURCE_WHERE = "{{ $labels.target }}" + _replica(" (", ")")


def alert(
    config: RulesConfig,
    name: str,
    expr: str,
    for_: str,
    severity: str,
    summary: str,
    description: str,
    extra_labels: dict[str, str] | None = None,
    *,
    dashboard: Link = ("overview", PER_SCRAPE),
) -> Rule:
    """One alerting rule in the mixin shape: severity label, summary, description, runbook and dashboard URLs."""
    board, variables = dashboard
    if "$self" in description:
        description = SELF + description
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity, **(extra_labels or {})},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": config.runbook_url(name),
            "dashboard_url": dashboard_link(config.dashboard_url(board), variables),
        },
    }


def _share(d: DetectorAlert) -> str:
    return f"at least {d.min_fraction:.0%} of the last {d.window}"


def _detector(config: RulesConfig, flag: str, value: str, d: DetectorAlert) -> str:
    """`value` over the window, kept only where the detector was true for enough of it."""
    sel = config.agent_selector
    on = labels(keep(config, *rank_labels(config)))
    return (
        f"{value}\n"
        f"and on ({on})\n"
        f"(avg_over_time({series(flag, sel)}[{d.window}]) >= {number(d.min_fraction)})"
    )


def _matching(metric: str, *matchers: str) -> str:
    """A template query's selector: `metric` with the alert's own labels ($self, %[1]s) and `matchers`."""
    return f"{metric}{{%[1]s{', '.join(matchers)}}}"


def _rate(metric: str, window: str) -> str:
    return f"sum(rate({_matching(metric)}[{window}]))"


def head_of_line_description(config: RulesConfig) -> str:
    """The inflation ($value), and in seconds the stalled ITL and its median, and prefill tokens per step."""
    hol, short, long = config.detector_alert("head_of_line"), config.itl_short_window, config.itl_long_window
    window = "window=%[2]q, percentile=%[3]q"
    stall = query_value(f"max_over_time({_matching(names.ITL, window)}[{hol.window}])", short, "99", unit=" s")
    median = query_value(_matching(names.ITL, window), long, "50", unit=" s")
    rate_window = config.rate_window
    per_step = query_value(
        f"{_rate(names.PROMPT_TOKENS, rate_window)} / {_rate(names.ENGINE_STEPS, rate_window)}", pipe='printf "%.0f"'
    )
    return (
        f"{WHERE}: the worst inter-token latency reached {{{{ $value | printf \"%.1f\" }}}}x its recent median "
        f"while prefill work shared the batch, during {_share(hol)}. ITL p99 over {short} peaked at {stall} "
        f"against a p50 over {long} of {median}; prefill ran {per_step} tokens per engine step over {rate_window}."
    )


def capacity_capped_description(config: RulesConfig) -> str:
    """KV occupancy ($value), preemptions per second and the queue, over the detector's window."""
    cap = config.detector_alert("capacity_capped")
    preemptions = query_value(_rate(names.PREEMPTIONS, cap.window))
    queue = query_value(f"avg_over_time({_matching(names.REQUESTS_WAITING)}[{cap.window}])")
    return (
        f"{WHERE}: KV cache {{{{ $value | humanizePercentage }}}} full on average, with preemptions and a "
        f"queue during {_share(cap)}: {preemptions} preemptions/s and {queue} requests waiting on average "
        f"over {cap.window}. The memory wall, not the scheduler, binds the batch."
    )


def admission_bound_description(config: RulesConfig) -> str:
    """The queue ($value), and how full the batch and the KV cache were meanwhile."""
    adm = config.detector_alert("admission_bound")
    occupancy = query_value(
        f"avg_over_time({_matching(names.BATCH_OCCUPANCY)}[{adm.window}])", pipe="humanizePercentage"
    )
    kv = query_value(f"avg_over_time({_matching(names.KV_USAGE)}[{adm.window}])", pipe="humanizePercentage")
    return (
        f"{WHERE}: {{{{ $value | printf \"%.0f\" }}}} requests waiting on average while the batch sat well "
        f"below its cap with KV room, during {_share(adm)}: the batch {occupancy} of its cap and KV {kv} full "
        f"on average over {adm.window}. Something upstream of the batch binds it."
    )


# The description of each detector alert that has one written for it, by the detector's key; any other
# detector's alert (one only declared in agent/signals/detectors/) says its title and its status-page sentence
# (generic_description).
DESCRIPTIONS: dict[str, Callable[[RulesConfig], str]] = {
    "head_of_line": head_of_line_description,
    "capacity_capped": capacity_capped_description,
    "admission_bound": admission_bound_description,
}


def _as_clause(title: str) -> str:
    """A title inside a sentence: its first letter lower-cased, unless its first word is an acronym (KV, ITL)."""
    first = title.split(" ", 1)[0]
    return title if len(first) > 1 and first[1].isupper() else title[:1].lower() + title[1:]


def generic_description(config: RulesConfig, d: Detector) -> str:
    return f"{WHERE}: {_as_clause(d.title)} during {_share(config.detector_alert(d.key))}. {d.sentence}"


def detector_alert(config: RulesConfig, d: Detector) -> Rule:
    """The alert over a detector's 0/1 gauge, as its declaration says (d.rule), with RulesConfig's thresholds."""
    assert d.rule is not None, f"detector {d.key} declares no gauge alert"
    t = config.detector_alert(d.key)
    describe = DESCRIPTIONS.get(d.key)
    return alert(
        config,
        d.alert,
        _detector(config, d.flag.metric, f"{d.rule.over}({series(d.rule.metric, config.agent_selector)}[{t.window}])", t),
        t.for_,
        t.severity,
        d.rule.summary,
        describe(config) if describe else generic_description(config, d),
        dashboard=(d.rule.board, PER_TARGET),
    )


def detector_alerts(config: RulesConfig) -> list[Rule]:
    """Every detector alert rendered over its gauge, in the detectors' order."""
    return [detector_alert(config, d) for d in detectors() if d.rule is not None]


# The low decode MBU alert, and the dashboard that shows its cause.
LOW_MBU_ALERT, LOW_MBU_BOARD = "RooflightLowDecodeMBU", "roofline"


def mbu_alert(config: RulesConfig) -> Rule:
    """Decode busy the whole window, yet streaming a small share of the GPUs' bandwidth."""
    on = labels(keep(config, *rank_labels(config)))
    running = series(names.REQUESTS_RUNNING, config.agent_selector)
    steps = series(names.ENGINE_STEPS, config.agent_selector)
    expr = (
        f"{mbu_record(config)} < {number(config.low_mbu_threshold)}\n"
        f"and on ({on})\n"
        f"(min_over_time({running}[{config.rate_window}]) >= {number(config.low_mbu_min_running)})\n"
        # no step at all is a stalled engine (RooflightEngineStalled pages for it), not a slow decode
        f"and on ({on})\n"
        f"(increase({steps}[{config.rate_window}]) > 0)"
    )
    w = config.rate_window
    steps_per_second = query_value(_rate(names.ENGINE_STEPS, w))
    batch = query_value(f"avg_over_time({_matching(names.REQUESTS_RUNNING)}[{w}])")
    return alert(
        config,
        LOW_MBU_ALERT,
        expr,
        config.low_mbu_for,
        "warning",
        "Decode streams a small share of the GPUs' memory bandwidth while requests are running.",
        f"{WHERE}: model bandwidth utilization is {{{{ $value | humanizePercentage }}}} over {w} "
        f"(below {config.low_mbu_threshold:.0%}) with the batch never empty, at {steps_per_second} engine steps/s with "
        f"{batch} requests running on average. A healthy decode streams 60-80%.",
        dashboard=(LOW_MBU_BOARD, PER_TARGET),
    )


def _failures(window: str) -> str:
    """The error reason a source failed with most over `window`."""
    return first_label(f"topk(1, increase({_matching(names.SOURCE_ERRORS)}[{window}]))", "reason")


def source_alerts(config: RulesConfig) -> list[Rule]:
    up = names.SOURCE_UP
    sel = config.agent_selector
    own = ("engine", "nvml")  # the sources with an alert of their own (the engine's: rules/outage.py)
    return [
        alert(
            config,
            "RooflightGPUDown",
            f"{series(up, sel, _source('nvml'))} == 0",
            config.gpu_down_for,
            "warning",
            "Rooflight cannot read the GPUs through NVML.",
            f"{SOURCE_WHERE}: NVML has failed every sample for {config.gpu_down_for}; GPU metrics, "
            f"MBU and MFU are missing for this node. Most failures: {_failures(config.gpu_down_for)}.",
            dashboard=("gpu", PER_SCRAPE),
        ),
        alert(
            config,
            "RooflightSourceDown",
            f"{series(up, sel, *(f'source!={_quoted(s)}' for s in own))} == 0",
            config.source_down_for,
            "warning",
            "A Rooflight source has failed every sample for a while; the series read from it are missing.",
            f"{SOURCE_WHERE}: the {{{{ $labels.source }}}} source has failed every sample for "
            f"{config.source_down_for} (process: the engine's CPU and memory, read from /proc). "
            f"Most failures: {_failures(config.source_down_for)}.",
            dashboard=("overview", PER_SOURCE),
        ),
    ]


def meta_alerts(config: RulesConfig) -> list[Rule]:
    """The agent's own scrape: down per pod, or absent altogether (then no Rooflight alert can fire)."""
    up = series("up", config.agent_job_selector)
    return [
        alert(
            config,
            "RooflightAgentDown",
            f"{up} == 0",
            config.agent_down_for,
            "warning",
            "Prometheus cannot scrape a Rooflight agent; its pod's Rooflight alerts and dashboards are blind.",
            f"{{{{ $labels.job }}}} target {{{{ $labels.instance }}}}"
            f"{{{{ if $labels.pod }}}} (pod {{{{ $labels.namespace }}}}/{{{{ $labels.pod }}}}){{{{ end }}}} has "
            f"failed every scrape for {config.agent_down_for} (up == 0): the agent is crashing, not listening "
            "on the scraped port, or refusing the scrape (TLS or basic auth).",
            dashboard=("overview", PER_SCRAPE),
        ),
        alert(
            config,
            "RooflightAgentAbsent",
            f"absent({up})",
            config.agent_absent_for,
            "warning",
            "No Rooflight agent is being scraped; no Rooflight alert can fire.",
            f"Prometheus has had no target matching {up} for {config.agent_absent_for}: the PodMonitor or "
            "ServiceMonitor is missing or not selected (kube-prometheus-stack selects by its `release` "
            "label), or the agent's scrape job is not named as the rules expect.",
            dashboard=("overview", same("job")),
        ),
    ]


def _quoted(value: str) -> str:
    return f'"{value}"'


def _source(name: str) -> str:
    return f"source={_quoted(name)}"
