"""`rooflight rules`' settings (agent/config/settings.py declares every command's; this is its rules part).

Each flag sets a field of the rules' config (rules/config.py, RulesConfig), whose defaults are the rules': the
command passes them when it builds its parser (rules/generate.py, flag_defaults), so a default lives in one
place, the config the checked-in rules are rendered from. Each detector alert's `for` and severity flags
come from the detectors' declarations (agent/signals/detectors/): one pair per detector that declares one.
"""

from __future__ import annotations

from typing import Any

from rooflight.agent.config.setting import RULES, Setting
from rooflight.agent.signals.detectors import Detector, detectors
from rooflight.collectors import engines

FORMATS = ("yaml", "prometheusrule")  # rules/generate.py OUTPUTS: the rule file, or a PrometheusRule
SEVERITIES = ("critical", "warning", "info")  # rules/config.py checks an alert's severity against them
SLOS = (("ttft", "time to first token"), ("itl", "inter-token latency"))


def _rules(key: str, help_: str = "", **kw: Any) -> Setting:
    return Setting(key, help_, commands=(RULES,), env=False, file=False, **kw)


def detector_stem(d: Detector) -> str:
    """The stem of a detector alert's flags: `--hol-for`, `--capacity-capped-severity`."""
    return (d.rule.flag if d.rule and d.rule.flag else d.key).replace("_", "-")


def _slo(slo: str, title: str) -> tuple[Setting, ...]:
    return (
        _rules(f"{slo}_metric", f"{title} histogram base name (default: the engine's)"),
        _rules(f"{slo}_threshold", f"{title} SLO threshold in seconds (a bucket edge)", type=float),
        _rules(f"{slo}_objective", "share of observations within it", type=float),
        _rules(f"{slo}_buckets", "the histogram's bucket edges if customised ('' = unknown)"),
        _rules(f"{slo}_threshold_for", f"{title} threshold for one model (repeat per model; a bucket edge)",
               action="append", metavar="MODEL=SECONDS"),
    )


def _detector_alerts() -> tuple[Setting, ...]:
    """Each detector alert's `for` and severity, its declaration's by default."""
    out: list[Setting] = []
    for d in detectors():
        if d.rule is not None:
            stem = detector_stem(d)
            out.append(_rules(stem.replace("-", "_") + "_for", f"how long {d.alert}'s condition holds before it "
                              "fires (default %(default)s)", flag_default=d.rule.for_))
            out.append(_rules(stem.replace("-", "_") + "_severity", f"{d.alert}'s severity label (default %(default)s)",
                              choices=SEVERITIES, flag_default=d.rule.severity))
    return tuple(out)


SETTINGS: tuple[Setting, ...] = (
    _rules("format", "yaml: a Prometheus rules file; prometheusrule: the same groups as a prometheus-operator "
           "PrometheusRule (default %(default)s)", choices=FORMATS),
    _rules("pod", "only the pod-level rules: each cluster's Prometheus, where a central ruler runs --fleet",
           action="store_true", exclusive="scope"),
    _rules("fleet", "only the rules that sum over replicas, plus RooflightClusterAbsent: the central ruler "
           "(Thanos, Mimir, vmalert) of clusters that remote-write to one store", action="store_true",
           exclusive="scope"),
    _rules("cluster_label", "the topology label naming a cluster, for RooflightClusterAbsent (default %(default)s)"),
    _rules("cluster_absent_for", "how long a cluster's agents may not reach the central ruler before "
           "RooflightClusterAbsent (--fleet; default %(default)s)"),
    _rules("release", "label release=<this> on the PrometheusRule (kube-prometheus-stack)"),
    _rules("name", "PrometheusRule name and group-name prefix"),
    _rules("agent_selector", "matchers for rooflight_* series, e.g. 'job=\"rooflight\"'"),
    _rules("topology_labels", "comma list of the labels Prometheus attaches to a scrape, kept by every rule "
           "('' = none; default %(default)s)"),
    _rules("replica_labels", "the topology labels that tell replicas apart; SLOs sum over them (default %(default)s)"),
    _rules("extra_labels", "comma list of more labels to keep (region,...)"),
    _rules("engine", "histogram names and edges",
           choices=tuple(sorted(a.ENGINE for a in engines.adapters() if a.SERVICE_FAMILIES is not None))),
    _rules("engine_selector", "matchers for the engine's TTFT/ITL histograms"),
    _rules("slo_group_by", "comma list of labels each SLO is computed by"),
    *(setting for slo, title in SLOS for setting in _slo(slo, title)),
    _rules("goodput_objective", "share of the proxy's judged requests that must meet every target of each --slo "
           "(goodput burn-rate alerts; default %(default)s)", type=float),
    _rules("request_error_objective", "share of the engine's finished requests that must not be aborted or failed "
           "(default %(default)s)", type=float),
    _rules("client_error_objective", "share of the proxy's inference requests that must not get a 5xx or an "
           "upstream error (default %(default)s)", type=float),
    _rules("slo_min_requests", "requests a burn row's long window must hold before it can fire (default %(default)s)",
           type=int),
    _rules("slo_model_label", "the engine's label naming the model, for --*-threshold-for (default %(default)s)"),
    _rules("low_mbu_threshold", "MBU (0..1) under which a decode busy the whole rate window alerts "
           "RooflightLowMBU (default %(default)s)", type=float),
    _rules("low_mbu_for", "how long MBU stays under --low-mbu-threshold before RooflightLowMBU (default "
           "%(default)s)"),
    *_detector_alerts(),
    _rules("source_down_for", "how long a source other than the engine and the GPU (process) may fail every "
           "sample before RooflightSourceDown (default %(default)s)"),
    _rules("engine_start_budget", "how long an engine may load (no good sample since the agent started) before "
           "RooflightEngineStartTimeout; until then it is starting, not down (default %(default)s)"),
    _rules("engine_stalled_for", "how long after a window of no progress with requests held the stall pages "
           "(default %(default)s)"),
    _rules("gpu_temperature_threshold", "degrees C a GPU must hold for the whole health window to alert (default "
           "%(default)s)", type=float),
    _rules("gpu_throttle_share", "share of the health window in thermal or power-brake slowdown that alerts "
           "(default %(default)s)", type=float),
    _rules("agent_job_selector", "matchers for the agent's own scrape in `up` (meta-monitoring; default %(default)s)"),
    _rules("agent_down_for", "how long the agent may fail every scrape (up == 0) before RooflightAgentDown "
           "(default %(default)s)"),
    _rules("agent_absent_for", "how long no scrape target may match --agent-job-selector before "
           "RooflightAgentAbsent (default %(default)s)"),
    _rules("itl_short_window", "the agent's shortest --windows entry, quoted by the head-of-line alert (default "
           "%(default)s)"),
    _rules("itl_long_window", "the agent's longest --windows entry (default %(default)s)"),
    _rules("saturation_window", "the agent's --windows entry the autoscaling saturation record reads (default "
           "%(default)s)"),
    _rules("capacity_window", "the agent's --windows entry the groups-needed record reads capacity over (default "
           "%(default)s)"),
    _rules("keep_firing_for", "how long the down, lost-GPU and stall alerts keep firing after their condition "
           "clears ('' = leave keep_firing_for out, for rulers without it: vmalert before 1.91, Prometheus before "
           "2.42; default %(default)s)"),
    _rules("runbook_base_url", "where docs/runbooks.md is served; each alert's runbook_url is <this>#<alert name in lower case> "
           "(default %(default)s)"),
    _rules("dashboard_base_url", "Grafana's URL; each alert's dashboard_url is <this>/d/<uid>?var-pod=... (default "
           "%(default)s)"),
    _rules("time_scale", "divide every duration of the rules (windows, for, burn rows) by N: the same rules, N times "
           "sooner, for a test stage against short-lived agents (default %(default)s)", type=int, metavar="N",
           flag_default=1),
    _rules("output", "write here instead of stdout", short="-o"),
)
