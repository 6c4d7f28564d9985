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

A model can be held to its own threshold (LatencySLO.by_model: a 70B model's TTFT is not an 8B's).
Its errors are counted against its own bucket edge in a branch of the same recording rule, `or`-ed
before the default branch, which leaves those models out (`model_name!="..."`, no regex to escape); the
burn alerts read the one record and say each model's threshold; the guard checks each model's edge.
"""

from __future__ import annotations

from rooflight.rules import burn
from rooflight.rules.alerts import alert
from rooflight.rules.burn import slo_windows
from rooflight.rules.config import BurnWindow, LatencySLO, RulesConfig
from rooflight.rules.promql import labels, le_matcher, record_name, series, window_suffix
from rooflight.rules.recording import Rule
from rooflight.rules.templates import first_sample, same

GUARD_ALERT = "RooflightSLOBucketMissing"


def error_record(config: RulesConfig, slo: LatencySLO, window: str) -> str:
    return record_name(config.slo_group_by, f"rooflight_{slo.name}_slo_errors", f"ratio_rate{window_suffix(window)}")


def slo_by(config: RulesConfig) -> str:
    """The SLO's by()/on() labels: where the service runs, then `slo_group_by` (model_name for vLLM)."""
    return labels(tuple(dict.fromkeys((*config.service_labels, *config.slo_group_by))))


def _only(config: RulesConfig, model: str) -> str:
    return f'{config.slo_model_label}="{model}"'


def exclusions(config: RulesConfig, slo: LatencySLO) -> tuple[str, ...]:
    """Matchers that leave out the models held to their own threshold (none without by_model)."""
    return tuple(f'{config.slo_model_label}!="{model}"' for model, _ in slo.by_model)


def threshold_text(config: RulesConfig, slo: LatencySLO) -> str:
    """The threshold in seconds as a template: each model's own where it has one, else the default."""
    label = config.slo_model_label
    opens = "".join(f'{{{{ if eq $labels.{label} "{model}" }}}}{t:g}{{{{ else }}}}' for model, t in slo.by_model)
    return f"{opens}{slo.threshold_seconds:g}" + "{{ end }}" * len(slo.by_model)


def error_ratio_rules(config: RulesConfig, slo: LatencySLO) -> list[Rule]:
    """One record per window: a line per model with its own threshold, `or` the default for the others."""
    by = slo_by(config)
    others = exclusions(config, slo)
    count = series(f"{slo.histogram}_count", slo.selector, *others)
    good = series(f"{slo.histogram}_bucket", slo.selector, le_matcher(slo.threshold_seconds), *others)
    rules: list[Rule] = []
    for w in slo_windows(config):
        lines = []
        for model, threshold in slo.by_model:
            own_count = series(f"{slo.histogram}_count", slo.selector, _only(config, model))
            own_good = series(f"{slo.histogram}_bucket", slo.selector, _only(config, model), le_matcher(threshold))
            own_total = f"sum by ({by}) (rate({own_count}[{w}]))"
            lines.append(f"({own_total} - sum by ({by}) (rate({own_good}[{w}]))) / {own_total} or\n")
        total = f"sum by ({by}) (rate({count}[{w}]))"
        expr = "".join(lines) + f"(\n  {total}\n  -\n  sum by ({by}) (rate({good}[{w}]))\n)\n/\n{total}"
        rules.append({"record": error_record(config, slo, w), "expr": expr})
    return rules


def where(config: RulesConfig) -> str:
    """The SLO's own labels as a template (model_name for vLLM): what a service-level alert names."""
    return "/".join(f"{{{{ $labels.{label} }}}}" for label in config.slo_group_by)


def _dashboard(config: RulesConfig) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The overview, filtered to where the service runs and its model (the engine's `job` is not the agent's)."""
    return ("overview", (*same("cluster", "namespace"), ("model", config.slo_model_label)))


def replicas(config: RulesConfig) -> tuple[str, ...]:
    """The labels that tell the service's replicas apart (instance where none is configured)."""
    return config.replica_labels or ("instance",)


def worst_replica(config: RulesConfig, slo: LatencySLO, window: str) -> str:
    """A sentence naming the replica with the highest p99 over `window`: the SLO pools its replicas, on-call
    needs the one to look at (its pod, else its instance)."""
    by = labels((*replicas(config), "le"))
    p99 = (f"topk(1, histogram_quantile(0.99, sum by ({by}) "
           f"(rate({slo.histogram}_bucket{{%[1]s}}[{window}]))) > 0)")  # > 0: not NaN where a replica saw none
    return f" Worst replica by p99 over {window}: {first_sample(p99, unit=' s')}."


def burn_alerts(config: RulesConfig, slo: LatencySLO) -> list[Rule]:
    def description(row: BurnWindow) -> str:
        return (f"{where(config)}: {{{{ $value | humanizePercentage }}}} of {slo.title} observations over the "
                f"last {row.long} exceeded {threshold_text(config, slo)}s (objective: {slo.objective * 100:g}% "
                f"within it); burn rate above {row.factor:g}x, confirmed over {row.short}."
                + worst_replica(config, slo, row.short))

    by = slo_by(config)
    # Both guards count requests: the TTFT histogram observes one a request, the ITL one a token, hundreds a
    # request. An ITL ratio times the requests is how many requests' worth of tokens were slow.
    requests = series(f"{config.ttft.histogram}_count", config.ttft.selector)
    return burn.burn_alerts(config, burn.BurnSLO(
        slo.alert, slo.budget, lambda w: error_record(config, slo, w), by, series(f"{slo.histogram}_count", slo.selector),
        lambda speed: f"The {slo.title} SLO error budget is burning {speed}.", description, _dashboard(config),
        requests=burn.increase_by(by, requests), model_label=config.slo_model_label,
    ))


def bucket_guard(config: RulesConfig, slo: LatencySLO) -> Rule:
    """Fires where the histogram exists but has no bucket at the SLO threshold (each model's own, if any)."""
    by = slo_by(config)
    lines = []
    for model, threshold in slo.by_model:
        own_count = series(f"{slo.histogram}_count", slo.selector, _only(config, model))
        own_edge = series(f"{slo.histogram}_bucket", slo.selector, _only(config, model), le_matcher(threshold))
        lines.append(f"(group by ({by}) ({own_count}) unless on ({by}) group by ({by}) ({own_edge})) or\n")
    others = exclusions(config, slo)
    count = series(f"{slo.histogram}_count", slo.selector, *others)
    edge = series(f"{slo.histogram}_bucket", slo.selector, le_matcher(slo.threshold_seconds), *others)
    return alert(
        config,
        GUARD_ALERT,
        "".join(lines) + f"group by ({by}) ({count})\nunless on ({by})\ngroup by ({by}) ({edge})",
        config.bucket_guard_for,
        "warning",
        "An SLO threshold is not a bucket edge of the engine's histogram, so its burn-rate alerts cannot fire.",
        f"{where(config)}: {slo.histogram} has no bucket at le={threshold_text(config, slo)}; "
        f"{slo.alert} is blind. Move the threshold to an existing edge or add the edge to the engine.",
        {"slo": slo.name},
        dashboard=_dashboard(config),
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
