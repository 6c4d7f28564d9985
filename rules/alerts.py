"""Alerts on the agent's own series: detectors, low decode MBU, and sources down.

Detector alerts read the agent's 0/1 gauges (evaluated every second by the agent, sampled by each
scrape) as the fraction of a window they were true, so one flicker neither fires nor resets them. Each
alert's value is the number on-call needs first (peak ITL inflation, KV occupancy, queue length, MBU).
Every alert carries `severity` and the annotations `summary`, `description`, `runbook_url`.

Joins are `on` the agent's labels plus the scrape's topology labels, so an alert fires for the replica
whose detector is true, not for every pod that exports the same target; its labels carry the pod and
instance, and its description names the replica (its `pod`, else its `instance`).
"""

from __future__ import annotations

from rooflight.agent.metrics import names
from rooflight.rules.config import DetectorAlert, RulesConfig
from rooflight.rules.promql import labels, number, series
from rooflight.rules.recording import Rule, keep, mbu_record, rank_labels


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
) -> Rule:
    """One alerting rule in the mixin shape: severity label, summary, description and runbook_url."""
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity, **(extra_labels or {})},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": config.runbook_url(name),
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


def detector_alerts(config: RulesConfig) -> list[Rule]:
    sel = config.agent_selector
    hol, cap, adm = config.head_of_line, config.capacity_capped, config.admission_bound
    return [
        alert(
            config,
            "RooflightHeadOfLineBlocking",
            _detector(
                config,
                names.HEAD_OF_LINE_BLOCKING,
                f"max_over_time({series(names.ITL_INFLATION, sel)}[{hol.window}])",
                hol,
            ),
            hol.for_,
            hol.severity,
            "Prefill work is stalling the decode batch (head-of-line blocking).",
            f"{WHERE}: the worst inter-token latency reached {{{{ $value | printf \"%.1f\" }}}}x its recent median "
            f"while prefill work shared the batch, during {_share(hol)}.",
        ),
        alert(
            config,
            "RooflightBatchCapacityCapped",
            _detector(
                config,
                names.BATCH_CAPACITY_CAPPED,
                f"avg_over_time({series(names.KV_USAGE, sel)}[{cap.window}])",
                cap,
            ),
            cap.for_,
            cap.severity,
            "The batch is capped by KV-cache capacity: occupancy pinned, preemptions climbing, requests waiting.",
            f"{WHERE}: KV cache {{{{ $value | humanizePercentage }}}} full on average, with preemptions and a "
            f"queue during {_share(cap)}. The memory wall, not the scheduler, binds the batch.",
        ),
        alert(
            config,
            "RooflightBatchAdmissionBound",
            _detector(
                config,
                names.BATCH_ADMISSION_BOUND,
                f"avg_over_time({series(names.REQUESTS_WAITING, sel)}[{adm.window}])",
                adm,
            ),
            adm.for_,
            adm.severity,
            "Requests are queueing while the batch and the KV cache have room (admission-bound).",
            f"{WHERE}: {{{{ $value | printf \"%.0f\" }}}} requests waiting on average while the batch sat well "
            f"below its cap with KV room, during {_share(adm)}. Something upstream of the batch binds it.",
        ),
    ]


def mbu_alert(config: RulesConfig) -> Rule:
    """Decode busy the whole window, yet streaming a small share of the GPUs' bandwidth."""
    on = labels(keep(config, *rank_labels(config)))
    running = series(names.REQUESTS_RUNNING, config.agent_selector)
    expr = (
        f"{mbu_record(config)} < {number(config.low_mbu_threshold)}\n"
        f"and on ({on})\n"
        f"(min_over_time({running}[{config.rate_window}]) >= {number(config.low_mbu_min_running)})"
    )
    return alert(
        config,
        "RooflightLowDecodeMBU",
        expr,
        config.low_mbu_for,
        "warning",
        "Decode streams a small share of the GPUs' memory bandwidth while requests are running.",
        f"{WHERE}: model bandwidth utilization is {{{{ $value | humanizePercentage }}}} over {config.rate_window} "
        f"(below {config.low_mbu_threshold:.0%}) with the batch never empty. A healthy decode streams 60-80%.",
    )


def source_alerts(config: RulesConfig) -> list[Rule]:
    up = names.SOURCE_UP
    sel = config.agent_selector
    return [
        alert(
            config,
            "RooflightEngineDown",
            f"{series(up, sel, _source('engine'))} == 0",
            config.engine_down_for,
            "critical",
            "Rooflight cannot scrape the inference engine.",
            f"{SOURCE_WHERE}: the engine's /metrics endpoint has failed every sample for "
            f"{config.engine_down_for}; the engine is down, hung, or unreachable from the agent.",
        ),
        alert(
            config,
            "RooflightGPUDown",
            f"{series(up, sel, _source('nvml'))} == 0",
            config.gpu_down_for,
            "warning",
            "Rooflight cannot read the GPUs through NVML.",
            f"{SOURCE_WHERE}: NVML has failed every sample for {config.gpu_down_for}; GPU metrics, "
            "MBU and MFU are missing for this node.",
        ),
    ]


def _source(name: str) -> str:
    return f'source="{name}"'
