"""Availability SLOs: the share of requests that failed, as multi-window multi-burn-rate alerts.

Two views of one promise, each with its own budget, both per service (summed over replicas, as the latency
SLOs are; rules/slo.py) and model:

- **The engine's**: requests the engine aborted or failed over all it finished, from its own counters
  (RulesConfig.requests_failed / requests_finished, by `rooflight rules --engine`: vLLM's
  `vllm:request_success_total` by `finished_reason` abort|error, SGLang's `sglang:num_aborted_requests_total`
  over `sglang:num_requests_total`). An abort storm (a client timeout shorter than the queue, a scheduler
  that drops requests) burns it.
- **The client's**: inference requests answered 5xx, or cut by an upstream error mid-stream, over all
  inference requests. Through `rooflight proxy` where it stands in front of the model's pods (its
  `rooflight_client_requests_total`, whose target is joined to the model Prometheus last saw it serve:
  rules/outage.py); else from the engine's own API server (RulesConfig.http_requests: vLLM's
  `http_requests_total` by status class, whose pod is joined to the model its engine names). A crash-looping
  engine behind a load balancer burns it while the engine's own finish counters reset. One budget per model,
  the pods its replicas: 3% of one model's requests failing pages once for that model, never once per pod.

Both use the SRE workbook rows of RulesConfig.burn_windows, built by rules/burn.py with its sample and
history guards. Their rules live in the SLO groups.
"""

from __future__ import annotations

from rooflight.agent.proxy import catalog
from rooflight.rules.alerts import Link
from rooflight.rules.burn import BurnSLO, burn_alerts, seconds, slo_windows
from rooflight.rules.config import BurnWindow, RulesConfig
from rooflight.rules.promql import labels, number, record_name, series, window_suffix
from rooflight.rules.recording import Rule, keep
from rooflight.rules.health import SCRAPE_ONLY
from rooflight.rules.outage import model_record
from rooflight.rules.slo import slo_by, where
from rooflight.rules.templates import same

REQUEST_ALERT = "RooflightRequestErrorBudgetBurn"
CLIENT_ALERT = "RooflightClientErrorBudgetBurn"
INFERENCE = 'route!="other"'  # chat and completions: what a client waits on


def request_record(config: RulesConfig, window: str) -> str:
    return record_name(config.slo_group_by, "rooflight_request_errors", f"ratio_rate{window_suffix(window)}")


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


def client_record(config: RulesConfig, window: str) -> str:
    return record_name(config.slo_group_by, "rooflight_client_request_errors", f"ratio_rate{window_suffix(window)}")


def client_requests_record(config: RulesConfig, window: str) -> str:
    return record_name(config.slo_group_by, "rooflight_client_requests", f"rate{window_suffix(window)}")


def _per_model(config: RulesConfig, rate: str, on: tuple[str, ...], models: str) -> str:
    """`rate` summed by service and model, each series given the `model_name` its `on` labels map to."""
    return f"sum by ({slo_by(config)}) (\n  {rate}\n  * on ({labels(on)}) group_left ({config.slo_model_label}) {models}\n)"


def _proxy_models(config: RulesConfig) -> str:
    """The model each proxied target serves, as the engine SLOs name it (model_name)."""
    return f'label_replace({model_record(config)}, "{config.slo_model_label}", "$1", "model", "(.*)")'


def _engine_models(config: RulesConfig) -> str:
    """The model each engine pod serves, from its finish counter (one per pod: an API server counts its HTTP
    responses for all of them together)."""
    by = labels(keep(config, config.slo_model_label))
    return f"topk by ({labels(keep(config))}) (1, group by ({by}) ({config.requests_finished}))"


def client_rules(config: RulesConfig) -> list[Rule]:
    """Requests answered 5xx or cut by the upstream, over all inference requests, per service and model: the
    proxy's where it runs for the model, else the engine's own HTTP counters; and the requests per second."""
    sel = config.agent_selector
    proxy_on, engine_on = keep(config, "target"), keep(config)
    total = series(catalog.REQUESTS, sel, INFERENCE)
    server = series(catalog.REQUESTS, sel, INFERENCE, 'status=~"5.."')
    cut = series(catalog.REQUESTS, sel, INFERENCE, 'status!~"5.."', 'finish_reason="upstream_error"')
    http_bad = _with(config.http_requests, 'status="5xx"')
    # proxy or engine, per model: the job differs (the agent's, the engine's), the model and where it runs not
    either = f"or on ({labels((*(l for l in config.service_labels if l not in SCRAPE_ONLY), *config.slo_group_by))})"
    rules: list[Rule] = []
    for w in slo_windows(config):
        proxy_all = _per_model(config, f"rate({total}[{w}])", proxy_on, _proxy_models(config))
        proxy_bad = _per_model(config, f"(rate({server}[{w}]) or rate({cut}[{w}]))", proxy_on, _proxy_models(config))
        engine_all = _per_model(config, f"rate({config.http_requests}[{w}])", engine_on, _engine_models(config))
        engine_bad = _per_model(config, f"rate({http_bad}[{w}])", engine_on, _engine_models(config))
        requests = client_requests_record(config, w)
        # each source's failures, 0 (not nothing) where it counts requests and none failed yet (no 5xx series
        # exists until one does); the proxy's where it runs, else the engine's
        bad = f"(\n{proxy_bad}\nor 0 * {proxy_all}\n)\n{either}\n(\n{engine_bad}\nor 0 * {engine_all}\n)"
        rules.append({"record": requests, "expr": f"{proxy_all}\n{either}\n{engine_all}"})
        rules.append({"record": client_record(config, w), "expr": f"(\n{bad}\n)\n/ on ({slo_by(config)})\n{requests}"})
    return rules


def _with(selector: str, matcher: str) -> str:
    """A selector with one more matcher: `name{a="b"}` + `c="d"` -> `name{a="b", c="d"}`."""
    name, brace, inner = selector.partition("{")
    return series(name, inner.rstrip("}") if brace else "", matcher)


def request_alerts(config: RulesConfig) -> list[Rule]:
    objective = config.request_error_objective

    def description(row: BurnWindow) -> str:
        return (f"{where(config)}: {{{{ $value | humanizePercentage }}}} of the requests the engine finished over the last "
                f"{row.long} were aborted or failed (objective: {objective * 100:g}% finished otherwise); "
                f"burn rate above {row.factor:g}x, confirmed over {row.short}.")

    return burn_alerts(config, BurnSLO(
        REQUEST_ALERT, 1.0 - objective, lambda w: request_record(config, w), slo_by(config), config.requests_finished,
        lambda speed: f"The engine's request error budget (aborted and failed requests) is burning {speed}.",
        description, _per_model_link(config), model_label=config.slo_model_label,
    ))


def _per_model_link(config: RulesConfig) -> Link:
    return ("overview", (*same("cluster", "namespace"), ("model", config.slo_model_label)))


def client_alerts(config: RulesConfig) -> list[Rule]:
    objective = config.client_error_objective

    def description(row: BurnWindow) -> str:
        return (f"{where(config)}: {{{{ $value | humanizePercentage }}}} of the inference requests over the last "
                f"{row.long} were answered 5xx or cut by an upstream error (objective: {objective * 100:g}% served), "
                f"over every pod of the model, as the proxy counts them where it runs, else the engine's API server; "
                f"burn rate above {row.factor:g}x, confirmed over {row.short}.")

    def requests(window: str) -> str:
        return f"{client_requests_record(config, window)} * {number(seconds(window))}"

    return burn_alerts(config, BurnSLO(
        CLIENT_ALERT, 1.0 - objective, lambda w: client_record(config, w), slo_by(config),
        client_requests_record(config, slo_windows(config)[0]),
        lambda speed: f"Clients of a model are getting server errors: its availability budget is burning {speed}.",
        description, _per_model_link(config), requests=requests, model_label=config.slo_model_label,
    ))


def engine_availability(config: RulesConfig) -> tuple[list[Rule], list[Rule]]:
    """(recording rules, alerting rules) of the engine's availability SLO, for the SLO groups."""
    return request_rules(config), request_alerts(config)


def client_availability(config: RulesConfig) -> tuple[list[Rule], list[Rule]]:
    """(recording rules, alerting rules) of the clients' availability SLO, for the SLO groups."""
    return client_rules(config), client_alerts(config)
