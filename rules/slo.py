"""TTFT and ITL SLOs as multi-window multi-burn-rate alerts, read straight from the engine's histograms.

SLI: the share of observations above the threshold, (count - bucket{le=T}) / count, recorded per window
(subtracting from count keeps test values exact). Each SRE-workbook row alerts when both its long and
short window burn faster than `factor x (1 - objective)`; page rows are `critical`, ticket rows
`warning`, each with its own `for`.

The pitfall this module guards: when T is not a bucket edge, `bucket{le=T}` matches nothing, the error
ratio is an empty vector and the burn alerts silently never fire. The config refuses unknown edges at
build time; `RooflightSLOBucketMissing` catches the rest at run time (custom buckets, a renamed
histogram, Prometheus 3 rewriting `le`).

An SLO is the service's, so its ratios sum over the service's replicas on purpose (the replica labels,
pod and instance, are aggregated away) and keep where the service runs (the other topology labels:
cluster, namespace, job), so two deployments of one model in two namespaces or clusters never share a
budget. The record names the `slo_group_by` level only.
"""

from __future__ import annotations

from rooflight.rules.alerts import alert
from rooflight.rules.config import LatencySLO, RulesConfig
from rooflight.rules.promql import labels, le_matcher, number, record_name, series, window_suffix
from rooflight.rules.recording import Rule

GUARD_ALERT = "RooflightSLOBucketMissing"

_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def _seconds(window: str) -> float:
    unit = window.lstrip("0123456789")
    return float(window[: len(window) - len(unit)]) * _UNIT_SECONDS[unit]


def error_record(config: RulesConfig, slo: LatencySLO, window: str) -> str:
    return record_name(config.slo_group_by, f"rooflight_{slo.name}_slo_errors", f"ratio_rate{window_suffix(window)}")


def slo_by(config: RulesConfig) -> str:
    """The SLO's by()/on() labels: where the service runs, then `slo_group_by` (model_name for vLLM)."""
    return labels(tuple(dict.fromkeys((*config.service_labels, *config.slo_group_by))))


def slo_windows(config: RulesConfig) -> list[str]:
    """Every window any burn row needs, shortest first."""
    windows = {w for row in config.burn_windows for w in (row.long, row.short)}
    return sorted(windows, key=_seconds)


def error_ratio_rules(config: RulesConfig, slo: LatencySLO) -> list[Rule]:
    by = slo_by(config)
    count = series(f"{slo.histogram}_count", slo.selector)
    good = series(f"{slo.histogram}_bucket", slo.selector, le_matcher(slo.threshold_seconds))
    rules: list[Rule] = []
    for w in slo_windows(config):
        total = f"sum by ({by}) (rate({count}[{w}]))"
        expr = f"(\n  {total}\n  -\n  sum by ({by}) (rate({good}[{w}]))\n)\n/\n{total}"
        rules.append({"record": error_record(config, slo, w), "expr": expr})
    return rules


def _where(config: RulesConfig) -> str:
    return "/".join(f"{{{{ $labels.{label} }}}}" for label in config.slo_group_by)


def burn_alerts(config: RulesConfig, slo: LatencySLO) -> list[Rule]:
    rules: list[Rule] = []
    for row in config.burn_windows:
        limit = number(row.factor * slo.budget)
        expr = (
            f"{error_record(config, slo, row.long)} > {limit}\n"
            f"and\n"
            f"{error_record(config, slo, row.short)} > {limit}"
        )
        speed = "fast" if row.severity == "critical" else "steadily"
        rules.append(
            alert(
                config,
                slo.alert,
                expr,
                row.for_,
                row.severity,
                f"The {slo.title} SLO error budget is burning {speed}.",
                f"{_where(config)}: {{{{ $value | humanizePercentage }}}} of {slo.title} observations over the "
                f"last {row.long} exceeded {slo.threshold_seconds:g}s (objective: {slo.objective * 100:g}% within it); "
                f"burn rate above {row.factor:g}x, confirmed over {row.short}.",
                {"long": row.long, "short": row.short},
            )
        )
    return rules


def bucket_guard(config: RulesConfig, slo: LatencySLO) -> Rule:
    """Fires where the histogram exists but has no bucket at the SLO threshold."""
    by = slo_by(config)
    count = series(f"{slo.histogram}_count", slo.selector)
    edge = series(f"{slo.histogram}_bucket", slo.selector, le_matcher(slo.threshold_seconds))
    return alert(
        config,
        GUARD_ALERT,
        f"group by ({by}) ({count})\nunless on ({by})\ngroup by ({by}) ({edge})",
        config.bucket_guard_for,
        "warning",
        "An SLO threshold is not a bucket edge of the engine's histogram, so its burn-rate alerts cannot fire.",
        f"{_where(config)}: {slo.histogram} has no bucket at le={slo.threshold_seconds:g}; "
        f"{slo.alert} is blind. Move the threshold to an existing edge or add the edge to the engine.",
        {"slo": slo.name},
    )


def slo_rules(config: RulesConfig) -> tuple[list[Rule], list[Rule]]:
    """(recording rules, alerting rules) for both latency SLOs."""
    records: list[Rule] = []
    alerts: list[Rule] = []
    for slo in (config.ttft, config.itl):
        records += error_ratio_rules(config, slo)
        alerts += burn_alerts(config, slo)
    alerts += [bucket_guard(config, slo) for slo in (config.ttft, config.itl)]
    return records, alerts
