"""Every `rooflight_client_*` metric the proxy exports: name, type, labels, unit and meaning.

The exposition renders from these definitions, the tests hold what the proxy serves to them, and
`python -m rooflight.agent.proxy.catalog` prints the reference table for docs/metrics.md.
"""

from __future__ import annotations

from rooflight.agent.metrics.catalog import MetricDef, counter, gauge, table_of

PREFIX = "rooflight_client_"

REQUESTS = "rooflight_client_requests_total"
IN_FLIGHT = "rooflight_client_requests_in_flight"
PROMPT_TOKENS = "rooflight_client_prompt_tokens_total"
OUTPUT_TOKENS = "rooflight_client_output_tokens_total"
TTFT_HISTOGRAM = "rooflight_client_time_to_first_token_seconds"
ITL_HISTOGRAM = "rooflight_client_inter_token_latency_seconds"
TPOT_HISTOGRAM = "rooflight_client_time_per_output_token_seconds"
E2E_HISTOGRAM = "rooflight_client_e2e_request_latency_seconds"
TTFT = "rooflight_client_ttft_seconds"
ITL = "rooflight_client_itl_seconds"
TPOT = "rooflight_client_tpot_seconds"
E2E = "rooflight_client_e2e_seconds"
SLO_REQUESTS = "rooflight_client_slo_requests_total"
SLO_GOOD = "rooflight_client_slo_good_requests_total"
GOODPUT_RATIO = "rooflight_client_goodput_ratio"
GOODPUT_RATE = "rooflight_client_goodput_requests_per_second"
SLO_TARGET = "rooflight_client_slo_target_seconds"
UPSTREAM_ERRORS = "rooflight_client_upstream_errors_total"
ACCOUNTING_ERRORS = "rooflight_client_accounting_errors_total"
OVER_BUDGET = "rooflight_client_accounting_over_budget_total"
REFUSED = "rooflight_client_connections_refused_total"
BAD_REQUESTS = "rooflight_client_bad_requests_total"
REQUEST_LOG_LOST = "rooflight_client_request_log_lost_total"
WORKER_RESTARTS = "rooflight_client_worker_restarts_total"

# Histogram key (as --buckets spells it) -> exported name, and the SLO key whose targets become edges.
HISTOGRAMS = {"ttft": TTFT_HISTOGRAM, "itl": ITL_HISTOGRAM, "tpot": TPOT_HISTOGRAM, "e2e": E2E_HISTOGRAM}

# Bucket edges for LLM serving (seconds). TTFT spans a cached short prompt (10 ms) to a queued long one
# (a minute); ITL and TPOT resolve the 5-50 ms range where decode lives, finely enough that a 2x stall
# is two buckets away (vLLM's 25/50/75 ms edges make a 4 -> 60 ms stall look like 2-3x); e2e spans a
# short answer to a 10-minute generation. Every SLO target is added as an edge of its histogram.
DEFAULT_BUCKETS: dict[str, tuple[float, ...]] = {
    "ttft": (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5,
             3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0),
    "itl": (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.035,
            0.04, 0.05, 0.06, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0),
    "tpot": (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.035,
             0.04, 0.05, 0.06, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0),
    "e2e": (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0,
            180.0, 300.0, 600.0),
}

TARGET = ("target",)
BY_REASON = ("target", "reason")
REQUEST_LABELS = ("target", "route", "stream", "status", "finish_reason", "tenant")
TOKEN_LABELS = ("target", "tenant", "counted_by")
HISTOGRAM_LABELS = ("target", "route")
WINDOWED = ("target", "window", "percentile")
SLO_LABELS = ("target", "slo", "tenant")
GOODPUT_LABELS = ("target", "slo", "window")


def _h(name: str, help_: str) -> MetricDef:
    return MetricDef(name, "histogram", HISTOGRAM_LABELS, "seconds", help_)


CATALOG: tuple[MetricDef, ...] = (
    counter(REQUESTS, REQUEST_LABELS, "requests", "Requests through the proxy. route: chat, completions or other (passed through); "
       "status: the HTTP status the client got (502/504 when the proxy could not reach the upstream), none if no response "
       "was started; finish_reason: the response's (stop, length, tool_calls, content_filter, function_call, abort, other, "
       "unknown) or what ended it instead (client_disconnected, upstream_error), none for errors and other routes."),
    gauge(IN_FLIGHT, TARGET, "requests", "Requests the proxy is relaying now."),
    counter(PROMPT_TOKENS, TOKEN_LABELS, "tokens", "Prompt tokens of finished inference requests, from the response's usage "
       "(counted_by=usage; the proxy has no tokenizer)."),
    counter(OUTPUT_TOKENS, TOKEN_LABELS, "tokens", "Output tokens of inference requests: from usage (counted_by=usage), else one "
       "per token-bearing choice in the stream's chunks (counted_by=chunks)."),
    _h(TTFT_HISTOGRAM, "Time from the request reaching the proxy to the first token-bearing chunk reaching it (streams)."),
    _h(ITL_HISTOGRAM, "Every gap between consecutive token-bearing chunks of a stream (an empty delta is a token too), as the proxy received them."),
    _h(TPOT_HISTOGRAM, "Per finished stream with 2+ output tokens: (last token chunk - first) / (output tokens - 1), as vllm bench serve computes it."),
    _h(E2E_HISTOGRAM, "Request to last byte, for inference requests that finished with a 2xx status."),
    gauge(TTFT, WINDOWED, "seconds", "Exact TTFT percentile over the window, from the requests that finished in it."),
    gauge(ITL, WINDOWED, "seconds", "Inter-token gap percentile over the window, within 0.5% (logarithmic bins of every gap)."),
    gauge(TPOT, WINDOWED, "seconds", "Exact TPOT percentile over the window, from the streams that finished in it."),
    gauge(E2E, WINDOWED, "seconds", "Exact end-to-end latency percentile over the window (2xx inference requests)."),
    counter(SLO_REQUESTS, SLO_LABELS, "requests", "Requests judged against the SLO: streamed inference requests that finished "
       "or failed, not those the client abandoned nor 4xx other than 429."),
    counter(SLO_GOOD, SLO_LABELS, "requests", "Judged requests that met every target of the SLO (DistServe goodput)."),
    gauge(GOODPUT_RATIO, GOODPUT_LABELS, "ratio", "Good / judged requests that finished in the window."),
    gauge(GOODPUT_RATE, GOODPUT_LABELS, "requests/s", "Good requests per second over the window (goodput)."),
    gauge(SLO_TARGET, ("target", "slo", "metric"), "seconds", "Each target of each configured SLO (metric: ttft, itl, tpot, e2e)."),
    counter(UPSTREAM_ERRORS, BY_REASON, "", "Requests the upstream failed: connect (unreachable: the client got 502), "
       "timeout (connect timeout: 504), bad_response (an answer no client could read safely: 502), disconnected "
       "(broke off mid-response)."),
    counter(ACCOUNTING_ERRORS, TARGET, "", "Failures of the proxy's own accounting; the traffic still flowed, the request "
       "went uncounted or partly counted. With workers, the requests in flight on a worker that died are counted "
       "here: they were cut before their records were made."),
    counter(OVER_BUDGET, TARGET, "", "Answers relayed unaccounted because the copies the accounting reads answers from "
       "(JSON bodies, unfinished SSE events) held at once reached their total budget (64 MiB)."),
    counter(REFUSED, BY_REASON, "", "Connections the proxy's port refused or closed: max_connections or "
       "per_client (answered 503), no_worker (--workers N: no worker could take it, answered 503), header_timeout (no complete request headers in time), body_timeout (a request "
       "body not in after --read-body-timeout of waiting for it, its pauses added up), body_reset (the client reset the "
       "connection before its request body was in)."),
    counter(BAD_REQUESTS, BY_REASON, "", "Requests answered 400 without reaching the upstream: malformed "
       "(not valid HTTP), target (not a path), unsendable (a target or header the proxy cannot send on)."),
    counter(REQUEST_LOG_LOST, TARGET, "", "Finished requests --request-log did not write: past 20,000 waiting for a "
       "file that blocks, or in a write that failed (a full disk). Exported only with --request-log."),
    counter(WORKER_RESTARTS, TARGET, "", "Relay processes replaced (--workers N): a worker that died, or that sent "
       "nothing for 10 s and was killed; only the connections it held were cut. Exported where the relay runs in processes "
       "of its own: rooflight proxy --workers above 1, rooflight run --proxy-listen."),
)

BY_NAME = {d.name: d for d in CATALOG}


def markdown_table() -> str:
    """The reference table for the client-side section of docs/metrics.md."""
    return table_of(CATALOG)


if __name__ == "__main__":
    print(markdown_table(), end="")
