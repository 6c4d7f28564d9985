"""Alerts on an engine that holds work and makes no progress, and on the GPUs' own health.

A hung engine answers its /metrics (the API process serves it) while its counters stay flat: no source is
down, no TTFT/ITL observation arrives for the burn-rate alerts to count, and MBU falls to zero only after
the low-MBU alert's half hour. `RooflightEngineStalled` reads the flat counters themselves: requests
running or waiting the whole window, and not one token of either phase, nor one engine step, in it. The
same counters read the same on an idle vLLM whose gauges stuck after a mass client abort (running > 0 with
nothing running), so the stall pages only once confirmed: the agent's canary (`rooflight run --canary`, a
1-token request sent while its own detector sees the stall) went unanswered. Without a canary it is a
warning.

A GPU that fell off the bus (XID 79) is what NVML says of it: GPU_IS_LOST on every call, which the agent
exports as `rooflight_gpu_up 0` and nothing else for that GPU. `RooflightGPULost` pages on it, for as long
as it lasts.

GPU health reads the NVML series the agent exports per GPU (`rooflight_gpu_*`, labels gpu and uuid), as
dcgm-exporter users alert on XID and double-bit ECC first: an XID of a hardware class (the GPU needs a
reset or a replacement), uncorrectable ECC errors, row remapping pending or failed, clocks held down by
thermal or power-brake slowdown for a share of the window, and temperature.
"""

from __future__ import annotations

from rooflight.agent.metrics import names
from rooflight.agent.signals.detectors import engine_stalled
from rooflight.collectors.nvml import GPU_EXTRA_METRICS
from rooflight.rules.alerts import PER_TARGET, WHERE, Link, alert
from rooflight.rules.burn import duration, seconds
from rooflight.rules.config import RulesConfig, hold
from rooflight.rules.promql import labels, number, series
from rooflight.rules.recording import Rule, keep, rank_labels
from rooflight.rules.templates import query_value, same

# XID codes whose cause is the GPU or its links and that need a reset or a replacement now (NVIDIA's XID
# catalogue): double-bit ECC (48), a row-remap failure (64), NVLink (74), fallen off the bus (79), contained and
# uncontained ECC (94, 95), GSP timeouts and errors (119, 120), unrecovered ECC (140). A row-remap recording
# event (63) and a high single-bit ECC rate (92) ask for a reset when convenient (RooflightGPURowRemapPending
# covers the first); application faults (13, 31, 43, 45) page nobody. All show on the GPU dashboard.
HARDWARE_XIDS = (48, 64, 74, 79, 94, 95, 119, 120, 140)
# nvmlClocksEventReason bits that mean the GPU is protecting itself: HW slowdown (8), SW thermal (32), HW
# thermal (64), HW power brake (128). SW power cap (4) is a busy GPU at its power limit: normal, not alerted.
SLOWDOWN_BITS = (8, 32, 64, 128)
ENGINE_SOURCE = 'source="engine"'  # the agent's engine source, in rooflight_source_up
GPU_LOST = "RooflightGPULost"

GPU_WHERE = (
    "GPU {{ $labels.gpu }} ({{ $labels.uuid }}"
    "{{ if $labels.pod }}, pod {{ $labels.pod }}{{ else if $labels.instance }}, {{ $labels.instance }}{{ end }})"
)
LAST_XID = query_value("rooflight_gpu_xid_last_code{%[1]s}", pipe='printf "%.0f"')  # the code, for the page
PER_GPU: Link = ("gpu", same("cluster", "namespace", "job", "pod", "instance"))


def _gpu(config: RulesConfig, key: str) -> str:
    """The per-GPU series the NVML collector exports for `key` (collectors/nvml.py, GPU_EXTRA_METRICS)."""
    if key not in GPU_EXTRA_METRICS:
        raise KeyError(f"the NVML collector exports no rooflight_gpu_{key}")
    return series(f"{names.PREFIX}gpu_{key}", config.agent_selector)


def _on_gpu(config: RulesConfig) -> str:
    return labels(keep(config, "gpu", "uuid"))


def stall_expr(config: RulesConfig) -> str:
    """Work held the whole window (running or waiting never dropped to 0), yet no token and no step moved,
    from an engine whose /metrics answers (one that does not is RooflightEngineDown's: the agent keeps its
    last gauges, which would read as held work).

    The value is the requests held now. The engine must export its steps (`rooflight_engine_steps_total`): an
    engine that counts tokens only when a request ends (TensorRT-LLM) shows no progress for as long as its
    longest request runs, which is not a hang; without a step counter the stall cannot be told.
    """
    w, sel = config.engine_stalled_window, config.agent_selector
    on = labels(keep(config, *rank_labels(config)))
    running, waiting = series(names.REQUESTS_RUNNING, sel), series(names.REQUESTS_WAITING, sel)
    prompt, generation = series(names.PROMPT_TOKENS, sel), series(names.GENERATION_TOKENS, sel)
    return (
        f"({running} + on ({on}) {waiting})\n"
        f"and on ({on})\n"
        f"(min_over_time({running}[{w}]) + on ({on}) min_over_time({waiting}[{w}]) > 0)\n"
        f"unless on ({on})\n"
        f"(increase({prompt}[{w}]) + on ({on}) increase({generation}[{w}]) > 0)\n"
        f"and on ({on})\n"
        f"(increase({series(names.ENGINE_STEPS, sel)}[{w}]) == 0)\n"
        f"and on ({labels(keep(config, 'target'))})\n"
        f"({series(names.SOURCE_UP, sel, ENGINE_SOURCE)} == 1)"
    )


def _canary(config: RulesConfig, result: str) -> str:
    return series(names.ENGINE_CANARY, config.agent_selector, f'result="{result}"')


def canary_failed(config: RulesConfig) -> str:
    """Targets whose canary (a 1-token request the agent sends an engine its detector calls stalled: `rooflight
    run --canary`) went unanswered within the stall window, and none was answered."""
    w, on = config.engine_stalled_window, labels(keep(config, "target"))
    return (f"sum by ({on}) (increase({_canary(config, 'failed')}[{w}])) > 0\n"
            f"unless on ({on})\n"
            f"sum by ({on}) (increase({_canary(config, 'ok')}[{w}])) > 0")


def engine_stalled_alerts(config: RulesConfig) -> list[Rule]:
    """Critical where the canary confirms the hang; a warning where the agent sends none (a hang and vLLM's
    gauges stuck after a mass abort read the same on the counters: running > 0, nothing moving)."""
    w, on = config.engine_stalled_window, labels(keep(config, "target"))
    held = (f"{WHERE}: {{{{ $value | printf \"%.0f\" }}}} requests are running or waiting and the engine has "
            f"produced no prompt or generated token and run no engine step for {w}, while its /metrics still answers.")
    name = engine_stalled.DETECTOR.alert  # the agent's engine_stalled detector judges the same at its resolution
    # keep_firing_for: a canary answered late, or a window edge between two of its tries, does not resolve a hang
    return [{**rule, **hold(config)} for rule in (
        alert(
            config, name,
            f"{stall_expr(config)}\nand on ({on})\n({canary_failed(config)})",
            config.engine_stalled_for, "critical",
            "The engine holds requests, makes no progress, and does not answer a 1-token request: it is hung.",
            f"{held} The agent's canary (a 1-token request) went unanswered: the engine is hung (a stuck "
            "collective, a dead worker, a deadlocked scheduler), not slow, and not idle behind stuck gauges.",
            dashboard=("overview", PER_TARGET),
        ),
        alert(
            config, name,
            f"{stall_expr(config)}\nunless on ({on})\ngroup by ({on}) ({_canary(config, 'ok')})",
            config.engine_stalled_for, "warning",
            "The engine holds requests and makes no progress; without a canary the hang is not confirmed.",
            f"{held} The agent sends no canary here (rooflight run --canary), so this may be a hang or an idle "
            "engine whose gauges stuck after a mass client abort (a vLLM bug): the runbook tells them apart.",
            dashboard=("overview", PER_TARGET),
        ),
    )]


def _any_of(value: str, codes: tuple[int, ...]) -> str:
    return " or ".join(f"{value} == {code}" for code in codes)


def _slowdown(value: str) -> str:
    """1 where any of SLOWDOWN_BITS is set in the bitmask `value`, else 0 (PromQL has no bitwise and)."""
    bits = " + ".join(f"floor({value} / {bit}) % 2" for bit in SLOWDOWN_BITS)
    return f"({bits}) > bool 0"


def gpu_health_alerts(config: RulesConfig) -> list[Rule]:
    on = _on_gpu(config)
    xids, last = _gpu(config, "xid_errors_total"), _gpu(config, "xid_last_code")
    window = config.gpu_health_window
    throttle = config.gpu_throttle_share
    return [
        {**alert(
            config,
            GPU_LOST,
            f"{_gpu(config, 'up')} == 0",
            config.gpu_lost_for,
            "critical",
            "A GPU fell off the bus: NVML has lost it, and every process on it with it.",
            f"{GPU_WHERE}: NVML answers GPU_IS_LOST for it (rooflight_gpu_up 0; XID 79, or a reset gone wrong). "
            "The engine on it has died or will; nothing it held is coming back. Drain the node, then reset or "
            "replace the GPU. Its heat and throttle alerts, and its pod's engine alerts, are inhibited under this one.",
            dashboard=PER_GPU,
        ), **hold(config)},
        alert(
            config,
            "RooflightGPUHardwareXid",
            f"increase({xids}[{window}]) > 0\nand on ({on})\n({_any_of(last, HARDWARE_XIDS)})",
            "0m",
            "critical",
            "A GPU reported an XID error of a hardware class: it needs a reset, or a replacement.",
            f"{GPU_WHERE}: XID {LAST_XID} within the last {window}. Requests on this GPU fail or hang until it "
            "is drained and reset.",
            dashboard=PER_GPU,
        ),
        alert(
            config,
            "RooflightGPUUncorrectableECC",
            f"increase({_gpu(config, 'ecc_uncorrected_errors_total')}[{window}]) > 0",
            "0m",
            "critical",
            "A GPU reported uncorrectable (double-bit) ECC errors.",
            f"{GPU_WHERE}: {{{{ $value | printf \"%.0f\" }}}} uncorrectable ECC errors in the last {window}. "
            "The process that owned the memory is killed by the driver; drain the node and reset the GPU.",
            dashboard=PER_GPU,
        ),
        alert(
            config,
            "RooflightGPURowRemapFailed",
            f"{_gpu(config, 'remapped_rows_failure')} == 1",
            "0m",
            "critical",
            "A GPU failed to remap a row of bad memory: it should be replaced.",
            f"{GPU_WHERE}: a row remap failed (NVML remapped rows: failure). The GPU has run out of spare rows "
            "or cannot remap; it will keep producing memory errors.",
            dashboard=PER_GPU,
        ),
        alert(
            config,
            "RooflightGPURowRemapPending",
            f"{_gpu(config, 'remapped_rows_pending')} == 1",
            "15m",
            "warning",
            "A GPU has a memory row remap pending: it needs a reset to take effect.",
            f"{GPU_WHERE}: a row remap is pending (NVML remapped rows: pending). Until the GPU is reset the bad "
            "row is still in use; drain and reset at the next window.",
            dashboard=PER_GPU,
        ),
        alert(
            config,
            "RooflightGPUThrottled",
            f"avg_over_time(({_slowdown(_gpu(config, 'clock_event_reasons'))})[{window}:{duration(seconds(window) / 10)}])\n"
            f">= {number(throttle)}",
            "5m",
            "warning",
            "A GPU's clocks are held down by thermal or power-brake slowdown.",
            f"{GPU_WHERE}: thermal, hardware or power-brake slowdown held the clocks down "
            f"{{{{ $value | humanizePercentage }}}} of the last {window} (alert at {throttle:.0%}). Decode and "
            "prefill slow with the clock: expect lower MBU and MFU on this GPU than on its peers.",
            dashboard=PER_GPU,
        ),
        alert(
            config,
            "RooflightGPUHot",
            f"min_over_time({_gpu(config, 'temperature_celsius')}[{window}])\n"
            f">= {number(config.gpu_temperature_celsius)}",
            "0m",
            "warning",
            "A GPU has run hot for a while.",
            f"{GPU_WHERE}: at least {{{{ $value | printf \"%.0f\" }}}} C throughout the last {window} (alert at "
            f"{config.gpu_temperature_celsius:g} C). Slowdown follows; check the node's cooling and airflow.",
            dashboard=PER_GPU,
        ),
    ]


# The labels an agent's scrape and its engine's differ in: the sidecar and the engine share the pod (and the
# cluster, namespace and host), not the scrape's job or address.
SCRAPE_ONLY = ("job", "instance")


def slo_blind_alert(config: RulesConfig) -> Rule:
    """Fires where an agent watches an engine of the SLOs' kind and Prometheus holds not both of its latency
    histograms there: the engine is not scraped, its histograms were renamed, or relabelling dropped them.
    Without them the TTFT and ITL burn-rate alerts are silent, not green."""
    watched = series(names.REQUESTS_RUNNING, config.agent_selector, f'engine="{config.slo_engine}"')
    ttft, itl = (series(f"{slo.histogram}_count", slo.selector) for slo in (config.ttft, config.itl))
    by_target, by_model = labels(keep(config, "target")), labels(keep(config, config.slo_model_label))
    return alert(
        config,
        "RooflightSLOHistogramMissing",
        f"group by ({by_target}) ({watched})\n"
        f"unless ignoring ({labels((*SCRAPE_ONLY, 'target', config.slo_model_label))})\n"
        f"(group by ({by_model}) ({ttft}) and on ({by_model}) group by ({by_model}) ({itl}))",
        config.bucket_guard_for,
        "warning",
        "Rooflight watches an engine whose latency histograms Prometheus does not have: its SLO alerts are blind.",
        f"{{{{ $labels.target }}}}{_replica_of()}: the agent watches a {config.slo_engine} engine, but Prometheus "
        f"holds no {config.ttft.histogram} and {config.itl.histogram} series from the same place. Scrape the "
        f"engine's /metrics (the chart's PodMonitor does) and keep its series in metricRelabelings: "
        f"{config.ttft.alert} and {config.itl.alert} cannot fire without them.",
        dashboard=("overview", same("cluster", "namespace", "pod")),
    )


def _replica_of() -> str:
    return "{{ if $labels.pod }} (pod {{ $labels.pod }}){{ end }}"


def health_alerts(config: RulesConfig) -> list[Rule]:
    return [*engine_stalled_alerts(config), *gpu_health_alerts(config), slo_blind_alert(config)]

