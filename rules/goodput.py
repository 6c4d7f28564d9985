"""Goodput SLOs as multi-window multi-burn-rate alerts, from the client-side proxy's exact counters.

The proxy (`rooflight proxy`, or `rooflight run --proxy-listen`; docs/proxy.md) judges each streamed
request against every configured SLO and counts it in `rooflight_client_slo_requests_total` (judged)
and, when it met every target of the SLO (DistServe goodput), in `rooflight_client_slo_good_requests_total`.
The proxy exports the good counter beside every judged one (0 included), so the error ratio per window
is exact, with no bucket edge to miss:

    (rate(judged) - rate(good)) / rate(judged)

summed over tenants. Each SRE-workbook row (RulesConfig.burn_windows, shared with the TTFT/ITL SLOs)
alerts when both its long and short window burn faster than `factor x (1 - goodput_objective)`; page
rows are `critical`, ticket rows `warning`.

Unlike the engine-histogram SLOs (rules/slo.py), these keep the replica: the client series carry no
model or service label, and every sidecar's scrape shares the agent's job, so summing over pods would
pool the budgets of unrelated deployments. Each ratio is per (topology labels, target, slo): the pod
whose clients are losing goodput is the one that pages, and its alert names it. Each configured SLO
spelling (the `slo` label, e.g. `ttft=0.5,tpot=0.05`) has its own budget.
"""

from __future__ import annotations

from rooflight.agent.proxy import catalog
from rooflight.rules import burn
from rooflight.rules.alerts import PER_SOURCE, SOURCE_WHERE
from rooflight.rules.burn import slo_windows
from rooflight.rules.config import BurnWindow, RulesConfig
from rooflight.rules.promql import labels, record_name, series, window_suffix
from rooflight.rules.recording import Rule, keep
from rooflight.rules.templates import query_value

ALERT = "RooflightGoodputBudgetBurn"
LEVEL = ("target", "slo")  # the agent's labels that name the record's level (the topology labels ride along)


def error_record(window: str) -> str:
    """The recorded error ratio over `window`: the share of judged requests that missed the SLO."""
    return record_name(LEVEL, "rooflight_client_slo_errors", f"ratio_rate{window_suffix(window)}")


def error_ratio_rules(config: RulesConfig) -> list[Rule]:
    """One record per window any burn row needs: bad / judged, per replica, target and SLO."""
    by = labels(keep(config, *LEVEL))
    judged = series(catalog.SLO_REQUESTS, config.agent_selector)
    good = series(catalog.SLO_GOOD, config.agent_selector)
    rules: list[Rule] = []
    for w in slo_windows(config):
        total = f"sum by ({by}) (rate({judged}[{w}]))"
        expr = f"(\n  {total}\n  -\n  sum by ({by}) (rate({good}[{w}]))\n)\n/\n{total}"
        rules.append({"record": error_record(w), "expr": expr})
    return rules


def _judged_rate(window: str) -> str:
    """Judged requests/s of the alert's own series over `window`, quoted so on-call can weigh a small sample."""
    return query_value(f"sum(rate({catalog.SLO_REQUESTS}{{%[1]s}}[{window}]))", unit=" requests/s")


def burn_alerts(config: RulesConfig) -> list[Rule]:
    objective = config.goodput_objective

    def description(row: BurnWindow) -> str:
        return (f"{SOURCE_WHERE}: {{{{ $value | humanizePercentage }}}} of the streamed requests over the last "
                f"{row.long} missed SLO {{{{ $labels.slo }}}} (objective: {objective * 100:g}% meeting every "
                f"target); burn rate above {row.factor:g}x, confirmed over {row.short}. "
                f"Judged: {_judged_rate(row.long)}.")

    return burn.burn_alerts(config, burn.BurnSLO(
        ALERT, 1.0 - objective, error_record, labels(keep(config, *LEVEL)),
        series(catalog.SLO_REQUESTS, config.agent_selector),
        lambda speed: f"The client-side goodput SLO error budget is burning {speed}.", description,
        ("overview", PER_SOURCE),
    ))


def goodput_rules(config: RulesConfig) -> tuple[list[Rule], list[Rule]]:
    """(recording rules, alerting rules) for every goodput SLO the proxies export."""
    return error_ratio_rules(config), burn_alerts(config)
