"""Availability SLOs: the share of requests that failed, as multi-window multi-burn-rate alerts.

Two views of one promise, each with its own budget:

- **The engine's**: requests the engine aborted or failed over all it finished, from its own counters
  (RulesConfig.requests_failed / requests_finished, by `rooflight rules --engine`: vLLM's
  `vllm:request_success_total` by `finished_reason` abort|error, SGLang's `sglang:num_aborted_requests_total`
  over `sglang:num_requests_total`), per service (summed over replicas, as the latency SLOs are;
  rules/slo.py) and model. An abort storm (a client timeout shorter than the queue, a scheduler that drops
  requests) burns it. Its rules live in the SLO groups.
- **The client's**, through `rooflight proxy`: inference requests answered 5xx, or cut by an upstream error
  mid-stream, over all inference requests, per replica and target as the goodput SLO is (rules/goodput.py).
  A crash-looping engine behind a load balancer burns it while the engine's own counters reset. Its rules
  live in the goodput groups (the proxy's own series, per replica).

Both use the SRE workbook rows of RulesConfig.burn_windows, built by rules/burn.py with its sample and
history guards.
"""

from __future__ import annotations

from rooflight.agent.proxy import catalog
from rooflight.rules.alerts import PER_SOURCE, SOURCE_WHERE
from rooflight.rules.burn import BurnSLO, burn_alerts, slo_windows
from rooflight.rules.config import BurnWindow, RulesConfig
from rooflight.rules.promql import labels, record_name, series, window_suffix
from rooflight.rules.recording import Rule, keep
from rooflight.rules.slo import slo_by, where
from rooflight.rules.templates import same

REQUEST_ALERT = "RooflightRequestErrorBudgetBurn"
CLIENT_ALERT = "RooflightClientErrorBudgetBurn"
CLIENT_LEVEL = ("target",)
INFERENCE = 'route!="other"'  # chat and completions: what a client waits on


def request_record(config: RulesConfig, window: str) -> str:
    return record_name(config.slo_group_by, "rooflight_request_errors", f"ratio_rate{window_suffix(window)}")


def client_record(window: str) -> str:
    return record_name(CLIENT_LEVEL, "rooflight_client_request_errors", f"ratio_rate{window_suffix(window)}")


def request_rules(config: RulesConfig) -> list[Rule]:
    """Failed (aborted, errored) over finished, per service and model, for every burn window."""
    by = slo_by(config)
    failed, finished = config.requests_failed, config.requests_finished
    rules: list[Rule] = []
    for w in slo_windows(config):
        total = f"sum by ({by}) (rate({finished}[{w}]))"
        # 0, not nothing, where no failure series exists yet: a panel and a burn row read a healthy 0
        bad = f"(sum by ({by}) (rate({failed}[{w}])) or 0 * {total})"
        rules.append({"record": request_record(config, w), "expr": f"{bad}\n/\n{total}"})
    return rules


def client_rules(config: RulesConfig) -> list[Rule]:
    """Requests answered 5xx or cut by the upstream, over all inference requests, per replica and target."""
    by = labels(keep(config, *CLIENT_LEVEL))
    sel = config.agent_selector
    total = series(catalog.REQUESTS, sel, INFERENCE)
    server = series(catalog.REQUESTS, sel, INFERENCE, 'status=~"5.."')
    cut = series(catalog.REQUESTS, sel, INFERENCE, 'status!~"5.."', 'finish_reason="upstream_error"')
    rules: list[Rule] = []
    for w in slo_windows(config):
        all_ = f"sum by ({by}) (rate({total}[{w}]))"
        # 0, not nothing, while no request has failed (no 5xx series exists until one does)
        failed = f"(sum by ({by}) (rate({server}[{w}]) or rate({cut}[{w}])) or 0 * {all_})"
        rules.append({"record": client_record(w), "expr": f"{failed}\n/\n{all_}"})
    return rules


def request_alerts(config: RulesConfig) -> list[Rule]:
    objective = config.request_error_objective

    def description(row: BurnWindow) -> str:
        return (f"{where(config)}: {{{{ $value | humanizePercentage }}}} of the requests the engine finished over the last "
                f"{row.long} were aborted or failed (objective: {objective * 100:g}% finished otherwise); "
                f"burn rate above {row.factor:g}x, confirmed over {row.short}.")

    return burn_alerts(config, BurnSLO(
        REQUEST_ALERT, 1.0 - objective, lambda w: request_record(config, w), slo_by(config), config.requests_finished,
        lambda speed: f"The engine's request error budget (aborted and failed requests) is burning {speed}.",
        description, ("overview", (*same("cluster", "namespace"), ("model", config.slo_model_label))),
    ))


def client_alerts(config: RulesConfig) -> list[Rule]:
    objective = config.client_error_objective

    def description(row: BurnWindow) -> str:
        return (f"{SOURCE_WHERE}: {{{{ $value | humanizePercentage }}}} of the inference requests over the last "
                f"{row.long} were answered 5xx or cut by an upstream error (objective: {objective * 100:g}% served); "
                f"burn rate above {row.factor:g}x, confirmed over {row.short}.")

    return burn_alerts(config, BurnSLO(
        CLIENT_ALERT, 1.0 - objective, client_record, labels(keep(config, *CLIENT_LEVEL)),
        series(catalog.REQUESTS, config.agent_selector, INFERENCE),
        lambda speed: f"Clients are getting server errors through the proxy: the error budget is burning {speed}.",
        description, ("overview", PER_SOURCE),
    ))


def engine_availability(config: RulesConfig) -> tuple[list[Rule], list[Rule]]:
    """(recording rules, alerting rules) of the engine's availability SLO, for the SLO groups."""
    return request_rules(config), request_alerts(config)


def client_availability(config: RulesConfig) -> tuple[list[Rule], list[Rule]]:
    """(recording rules, alerting rules) of the clients' availability SLO, for the goodput groups."""
    return client_rules(config), client_alerts(config)
