"""Serving overview: is the service meeting its latency SLOs, and is each phase keeping up?

The SLO row under the attainment shows how fast each SLO the rules alert on burns its budget, per window
(dashboards/shared.py, also on the Fleet dashboard); the Capacity row, how close each pod is to its first
wall, the number the autoscaling examples scale on.

TTFT belongs to prefill (plus queueing), ITL to decode; throughput is shown per phase, never combined,
because a combined number hides the phase split every diagnosis starts from. Head-of-line blocking gets
a row of its own: the ITL tail, the prefill work per step, the tail inflation and the detector's verdict,
side by side on one time axis, because the diagnosis is that they move together. With the proxy running
(docs/proxy.md), a row sets what the clients saw beside what the engine measured: the gap between them is
time the engine cannot see (queueing in front of it, its API server delivering tokens late).
"""

from __future__ import annotations

from typing import Any

from rooflight.agent.metrics import names as n
from rooflight.agent.proxy import catalog as client
from rooflight.agent.signals.detectors import DetectorThresholds
from rooflight.agent.signals.detectors.head_of_line import ITL_INFLATION
from rooflight.rules.config import RulesConfig, service_families

from .panels import (
    ALERT,
    BY_NATIVE,
    BY_SCRAPE,
    CLIENT,
    CLIENT_WINDOWED,
    ENGINE,
    NATIVE,
    SCRAPE,
    WHO,
    WINDOWED,
    Grid,
    alert_table,
    build,
    custom_variable,
    detector_panel,
    engine_variables,
    info_table,
    native,
    query,
    sel,
    single,
    ts,
)
from .shared import active_alerts, slo_row

UID = "rooflight-overview"

# SLO thresholds must be bucket boundaries the engine exposes (the TTFT and ITL buckets of the engine the
# rules read, vLLM by default, spelled as it writes them); a threshold between buckets would silently
# match nothing. The defaults are the rules' (rules/config.py), so the attainment shown judges by the
# threshold the burn alerts page on. The engine's own families are its adapter's (collectors/engines.py).
_RULES = RulesConfig()
_FAMILIES = service_families(_RULES.slo_engine)


def _edges(buckets: tuple[float, ...], low: float, high: float) -> list[str]:
    """The engine's bucket edges from low to high, as Python (and so vLLM's client) prints them."""
    return [repr(float(b)) for b in buckets if low <= b <= high]


TTFT_SLO_BUCKETS = _edges(_RULES.ttft.buckets, 0.1, 5.0)
ITL_SLO_BUCKETS = _edges(_RULES.itl.buckets, 0.025, 0.5)
TTFT_SLO_DEFAULT = repr(float(_RULES.ttft.threshold_seconds))
ITL_SLO_DEFAULT = repr(float(_RULES.itl.threshold_seconds))

# The detector's own thresholds, drawn as lines on the panels that show its inputs.
HOL = DetectorThresholds()

_TTFT = _RULES.ttft.histogram
_ITL = _RULES.itl.histogram
if _FAMILIES.prefill is None:  # the "Queue time vs prefill time" panel reads it
    raise RuntimeError(f"{_RULES.slo_engine} declares no prefill histogram for the overview dashboard")
_PREFILL = _FAMILIES.prefill.name
_FINISHED = _RULES.requests_finished
_RI = "[$__rate_interval]"
_ENGINE_WHO = "{{pod}} {{model_name}}"
_P50_P99 = 'percentile=~"50|99"'
_INFERENCE = CLIENT + ', route!="other"'  # the proxy's timed routes (chat, completions), not pass-through
# One agent's one engine, one window and percentile: where a client percentile meets the engine's.
_BY_PERCENTILE = f"{BY_SCRAPE}, target, window, percentile"


def _rate_sum(metric: str, **extra: str) -> str:
    """Per engine and model: the rate of one of the engine's own counters (or histogram series)."""
    return f"sum by ({BY_NATIVE}) (rate({metric}{sel(NATIVE, **extra)}{_RI}))"


def _attainment(base: str, slo_var: str) -> str:
    """Share of the histogram's observations at or under the SLO bucket, per engine and model."""
    return f"{_rate_sum(base + '_bucket', le=f'${slo_var}')} / {_rate_sum(base + '_count')}"


def _engine_quantile(q: str, base: str) -> str:
    """The engine histogram's quantile per engine and model (Prometheus resolution), for the selection."""
    return native(f"histogram_quantile({q}, sum by ({BY_NATIVE}, le) (rate({base}_bucket{sel(NATIVE)}{_RI})))")


def _percentiles(metric: str, what: str) -> list[Any]:
    """The agent's p50/p90/p99 of a per-request distribution over $window, per pod."""
    return [query(f"{metric}{sel(WINDOWED)}", f"{{{{pod}}}} {what} p{{{{percentile}}}} {{{{model}}}} r{{{{rank}}}}", "A")]


def _client_vs_engine(client_metric: str, engine_metric: str) -> list[Any]:
    """The client's p50/p99 (from the proxy) and the engine's (from its histogram), over $window, per pod."""
    return [
        query(f"{client_metric}{sel(CLIENT_WINDOWED + ', ' + _P50_P99)}",
              "{{pod}} client p{{percentile}} {{target}}", "A"),
        query(f"{engine_metric}{sel(WINDOWED + ', ' + _P50_P99)}",
              "{{pod}} engine p{{percentile}} {{model}} r{{rank}}", "B"),
    ]


def _client_minus_engine(client_metric: str, engine_metric: str) -> str:
    """Client percentile - engine percentile, same target, window and percentile (ranks: the slowest)."""
    return (f"{client_metric}{sel(CLIENT_WINDOWED + ', ' + _P50_P99)} - on ({_BY_PERCENTILE}) "
            f"max by ({_BY_PERCENTILE}) ({engine_metric}{sel(WINDOWED + ', ' + _P50_P99)})")


def _client_row(g: Grid) -> None:
    """What the clients saw (the proxy's rooflight_client_*) beside what the engine measured."""
    g.row("Client vs engine (rooflight proxy)")
    g.add(ts(
        "TTFT: client vs engine p50 / p99",
        "Time to first token as the clients saw it (rooflight_client_ttft_seconds: exact percentiles over $window "
        "from every request the proxy relayed) beside the engine's own (rooflight_ttft_seconds, from its "
        "histogram), per pod. The client's includes what the engine cannot time: queueing in front of it, HTTP, "
        "and its API server delivering the first token. They meet when the engine's frontend keeps up; the next "
        "panels say by how much they do not. Blank unless the proxy runs (docs/proxy.md).",
        "s", _client_vs_engine(client.TTFT, n.TTFT),
    ), 12, 8)
    g.add(ts(
        "ITL: client vs engine p50 / p99",
        "Inter-token latency as the clients received it (rooflight_client_itl_seconds: every gap between streamed "
        "chunks, within 0.5%) beside the engine's (rooflight_itl_seconds, from its buckets: vLLM's 25/50/75 ms "
        "edges), per pod. The client's p99 resolves a head-of-line stall the engine's buckets blur. A client p50 "
        "near 0 under a normal engine p50 means tokens arrive in bursts: the API server fell behind the engine and "
        "delivers several per read (decode is fine, delivery is not: give the API server CPU).",
        "s", _client_vs_engine(client.ITL, n.ITL),
    ), 12, 8)
    g.add(ts(
        "TTFT the engine does not see (client - engine)",
        "The client's TTFT percentile minus the engine's, same window and percentile, per pod: time before the "
        "engine stamps a request's arrival or after it makes the first token (queueing in front of the engine, "
        "tokenization, the API server's delivery). Near 0 is healthy; growing with load while the engine's TTFT "
        "stays flat is a frontend bottleneck, not prefill. A difference of percentiles, not of each request's "
        "times: read it as a trend.",
        "s", [query(_client_minus_engine(client.TTFT, n.TTFT), "{{pod}} p{{percentile}} {{target}}", "A")],
        min_val=None,
    ), 8, 8)
    g.add(ts(
        "Client goodput by SLO",
        "Share of the streamed requests that finished over $window meeting every target of an SLO (--slo "
        "ttft=0.5,tpot=0.05: TTFT and time per output token both, the DistServe goodput), exact, from the proxy, "
        "per pod and SLO. The TTFT SLO attainment above judges the engine's TTFT alone, by bucket; this is what "
        "the clients got. RooflightGoodputBudgetBurn fires when its error budget burns.",
        "percentunit", [query(f"{client.GOODPUT_RATIO}{sel(CLIENT_WINDOWED)}", "{{pod}} {{slo}} {{target}}", "A")],
        max_val=1, thresholds=[(None, "transparent"), (0.99, "green")],
    ), 8, 8)
    g.add(ts(
        "Client requests by finish reason",
        "Inference requests per second through the proxy by how they ended, per pod: stop or length (finished), "
        "client_disconnected (the client gave up, often on a TTFT past its timeout; the proxy hangs up and vLLM "
        "or SGLang abort the request), upstream_error (the engine refused, broke off or was unreachable: "
        "502/504), abort (the engine's own). Disconnects rising with the client-engine gap point at the frontend.",
        "reqps", [query(f"sum by ({BY_SCRAPE}, target, finish_reason) "
                        f"(rate({client.REQUESTS}{sel(_INFERENCE)}{_RI}))",
                        "{{pod}} {{finish_reason}} {{target}}", "A")],
    ), 8, 8)


def _capacity_row(g: Grid) -> None:
    """How close each pod is to its first wall, which wall, and what it could carry: the autoscaler's input."""
    g.row("Capacity (the autoscaler's input)")
    g.add(ts(
        "Saturation by role",
        "rooflight_saturation_ratio over $window: 1 - the smallest headroom among the resources of the engine's "
        "role (both: all; prefill: prefill compute and the TTFT SLO; decode: KV, batch, decode bandwidth and the "
        "ITL SLO), per pod. 1 (the red line) is the first wall. The autoscaling examples (deploy/k8s/autoscaling, "
        "docs/deploy.md section Autoscaling) scale each pool so its pods' mean sits at their threshold: a pool "
        "held above it is not getting the replicas it asks for (the autoscaler's max, quota, GPUs); one pod far "
        "above the others is uneven routing. The Binding resource table says which wall, and whether a "
        "setting fixes it rather than replicas.",
        "percentunit", [query(f"{n.SATURATION}{sel(WINDOWED)}", "{{pod}} {{role}} {{model}} r{{rank}}", "A")],
        thresholds=[(None, "transparent"), (1.0, "red")],
    ), 12, 8)
    g.add(ts(
        "Headroom by resource",
        "rooflight_headroom_ratio over $window, one line per resource, per pod: 1 idle, 0 at that wall. kv "
        "(1 - KV occupancy, 0 if it preempted), batch (1 - running / cap), decode_bandwidth and prefill_compute "
        "(the roofline's room), ttft_slo and itl_slo (1 - p99 / the SLO, where --ttft-slo/--itl-slo are set). "
        "The lowest line is the wall you meet first: kv, raise the KV pool or shorten contexts; batch, raise "
        "max_num_seqs; the compute or bandwidth roof, add replicas.",
        "percentunit", [query(f"{n.HEADROOM}{sel(WINDOWED)}", "{{pod}} {{resource}} {{model}} r{{rank}}", "A")],
        max_val=1,
    ), 12, 8)
    g.add(ts(
        "Predicted capacity vs load",
        "Requests/s each pod's engine could sustain at the window's prompt/output mix before its first wall "
        "(rooflight_capacity_requests_per_second, from the roofline) beside the requests/s it serves now "
        "(rooflight_requests_per_second), per pod. Load near capacity: scale out before the queue grows; "
        "capacity falling at steady load: the mix moved to longer prompts or outputs (Requests row).",
        "reqps", [
            query(f"{n.CAPACITY_REQUESTS}{sel(WINDOWED)}", f"{WHO} capacity", "A"),
            query(f"{n.REQUESTS_PER_SECOND}{sel(WINDOWED)}", f"{WHO} load", "B"),
        ],
    ), 12, 8)
    g.add(info_table(
        "Binding resource",
        "Which resource sets each pod's saturation now (rooflight_saturation_binding_info: one row per pod, "
        "model, rank and role, the resource column names the wall). kv or batch: a memory or configuration "
        "lever on the KV cache and batch dashboard; decode_bandwidth or prefill_compute: the roofline, more "
        "replicas; ttft_slo or itl_slo: latency, see the rows above.",
        query(f"{n.SATURATION_BINDING}{sel(WINDOWED)}", WHO, "A", instant=True, table=True),
        ("Time", "Value", "__name__", "job", "instance", "window"),
    ), 12, 8)


def dashboard() -> dict[str, Any]:
    g = Grid()
    g.row("Firing alerts")
    g.add(alert_table(
        "Firing Rooflight alerts",
        "Every Rooflight alert firing now in the selected clusters, namespaces and pods, one row each: the alert, "
        "its pod (none for a model's: an SLO burn, a model down), its severity (critical pages, warning "
        "tickets) and since when it fires. Red regions on every time series below mark when each fired; the "
        "runbook of each is docs/runbooks.md, its heading the alert's name.",
        f'1000 * max by (cluster, namespace, pod, alertname, severity, model) (ALERTS_FOR_STATE{{{ALERT}}} '
        f'and ignoring (alertstate) ALERTS{{{ALERT}, alertstate="firing"}})',
        (("alertname", "alert"), ("pod", "pod"), ("severity", "severity"), ("Value", "since"),
         ("model", "model"), ("namespace", "namespace"), ("cluster", "cluster")),
    ), 24, 6)
    g.row("SLOs and goodput")
    g.add(single(
        "TTFT SLO attainment",
        "Share of requests whose time to first token (queueing + the whole prefill) met $ttft_slo s, from the "
        "engine's TTFT histogram, one value per pod. Below the SLO target: prefill is queueing or a long prompt "
        "is blocking the line; the Latency row says which.",
        "percentunit", query(native(_attainment(_TTFT, "ttft_slo")), _ENGINE_WHO, "A", instant=True),
        thresholds=[(None, "red"), (0.9, "orange"), (0.99, "green")], decimals=1,
    ), 8, 5)
    g.add(single(
        "ITL SLO attainment",
        "Share of inter-token gaps at or under $itl_slo s (per token, not per request), one value per pod. "
        "Decode sets ITL: a low value with a steady median is stutter, usually head-of-line blocking by long "
        "prefills (see the Head-of-line blocking row).",
        "percentunit", query(native(_attainment(_ITL, "itl_slo")), _ENGINE_WHO, "A", instant=True),
        thresholds=[(None, "red"), (0.9, "orange"), (0.99, "green")], decimals=1,
    ), 8, 5)
    g.add(single(
        "Goodput bound (req/s meeting TTFT SLO)",
        "Finished requests per second times TTFT attainment, per pod: an upper bound on goodput, the requests/s "
        "that meet both the TTFT and ITL SLOs. Raising batch raises tokens/s but can lower this; optimize this "
        "number.",
        "reqps", query(native(f"{_rate_sum(_FINISHED)} * ({_attainment(_TTFT, 'ttft_slo')})"),
                       _ENGINE_WHO, "A", instant=True), decimals=2,
    ), 8, 5)

    slo_row(g)

    g.row("Latency")
    g.add(ts(
        "TTFT p50 / p90 / p99",
        "Time to first token: queueing plus the entire prefill, the agent's percentiles over $window from the "
        "engine's histogram deltas, per pod; 'engine histogram p99' is the engine's own p99 at Prometheus "
        "resolution. A rising p99 with a flat p50 is queueing or long prompts; all three rising is prefill "
        "capacity.",
        "s", [
            query(f"{n.TTFT}{sel(WINDOWED)}", "{{pod}} p{{percentile}} {{model}} r{{rank}}", "A"),
            query(_engine_quantile("0.99", _TTFT), f"{_ENGINE_WHO} engine histogram p99", "B"),
        ],
    ), 12, 8)
    g.add(ts(
        "Queue time vs prefill time",
        "TTFT split in two: queue time, how long a request waited before it was first scheduled (the agent's "
        "p50/p99 over $window from the engine's queue-time histogram: vLLM, SGLang, TGI), and prefill time, from "
        "then to its first token (vLLM's request histogram at Prometheus resolution), per pod. Queue-dominated "
        "TTFT is a capacity or admission problem (see the KV cache and batch dashboard); prefill-dominated TTFT "
        "is prefill compute: judge it by prefill MFU and the prompt lengths.",
        "s", [
            query(f"{n.REQUEST_QUEUE_TIME}{sel(WINDOWED + ', ' + _P50_P99)}",
                  "{{pod}} queue p{{percentile}} {{model}} r{{rank}}", "A"),
            query(_engine_quantile("0.99", _PREFILL), f"{_ENGINE_WHO} prefill p99", "B"),
        ],
    ), 12, 8)

    _client_row(g)

    g.row("Head-of-line blocking")
    g.add(ts(
        "ITL p50 / p99 (agent, 10 s window)",
        "Inter-token latency, the gap between streamed tokens, from the agent's 10 s window (higher resolution "
        "than a Prometheus rate), per pod. p99 spiking while p50 stays flat, in step with prefill tokens per "
        "step, is the head-of-line signature: a prefill stalled every in-flight decode. 'engine histogram p99' "
        "is the same from Prometheus.",
        "s", [
            query(n.ITL + sel(ENGINE + ', percentile=~"50|99"', window="10s"),
                  "{{pod}} p{{percentile}} {{model}} r{{rank}}", "A"),
            query(_engine_quantile("0.99", _ITL), f"{_ENGINE_WHO} engine histogram p99", "B"),
        ],
    ), 12, 8)
    g.add(ts(
        "Prefill tokens per step (10 s)",
        "Computed prompt tokens (prefix-cache hits excluded) per engine step over the 10 s window: the prefill "
        "work sharing the batch, the detector's prefill input. At or above the line "
        f"({HOL.hol_min_prefill_tokens_per_step:g}) prefill is in the batch; one 8,000-token prompt over 10 s of "
        "6 ms steps reads ~5. A spike here in step with the ITL p99 is a long prompt prefilled whole.",
        "short", [query(
            f'sum without (phase) ({n.TOKENS_PER_SECOND}{sel(ENGINE, phase="prefill", window="10s")})'
            f' / ({n.STEPS_PER_SECOND}{sel(ENGINE, window="10s")} > 0)', WHO, "A")],
        thresholds=[(None, "transparent"), (HOL.hol_min_prefill_tokens_per_step, "orange")],
    ), 12, 8)
    g.add(ts(
        "ITL tail inflation ratio",
        "rooflight_itl_tail_inflation: the worst ITL since the agent's previous sample (the upper bound of "
        "the highest ITL bucket that gained observations) over its own recent median (the median of that worst "
        "over the longest window). ~1 on steady traffic; at or above the line "
        f"({HOL.hol_inflation:g}x) with prefill in the batch it is head-of-line blocking. An 8,000-token prompt "
        "run whole on an 8B model reads ~43x; chunked into 512-token pieces ~4x.",
        "none", [query(f"{ITL_INFLATION}{sel(ENGINE)}", WHO, "A")],
        log=True, min_val=None, thresholds=[(None, "transparent"), (HOL.hol_inflation, "red")],
    ), 12, 8)
    g.add(detector_panel(
        "overview", "Head-of-line detector",
        "rooflight_head_of_line_blocking, 1 while the ITL tail inflation reached its threshold with prefill in "
        "the batch and no preemptions (a preempted sequence's late token is the capacity-capped verdict's, on "
        "the KV cache and batch dashboard). Held 30 s after each stall so a 15-30 s scrape sees it. "
        "RooflightHeadOfLineBlocking fires when it stays 1 for a share of a longer window: recurring stalls.",
    ), 12, 8)

    g.row("Throughput and queue")
    g.add(ts(
        "Tokens/s: prefill and decode",
        "Prompt (prefill, compute-bound) and generated (decode, bandwidth-bound) tokens per second over $window, "
        "per pod, never combined. Prefill scales with FLOP/s, decode with batch; judge them with MFU and MBU "
        "respectively.",
        "short", [query(f"{n.TOKENS_PER_SECOND}{sel(WINDOWED)}", "{{pod}} {{phase}} {{model}} r{{rank}}", "A")],
    ), 12, 8)
    g.add(ts(
        "Requests running / waiting",
        "Running = the continuous batch (sequences decoding together, each step); waiting = queued requests, "
        "per pod. A nonempty queue while running sits below its cap means something upstream (admission, KV, "
        "token budget) is binding; see the KV cache and batch dashboard.",
        "short", [
            query(f"{n.REQUESTS_RUNNING}{sel(ENGINE)}", f"{WHO} running", "A"),
            query(f"{n.REQUESTS_WAITING}{sel(ENGINE)}", f"{WHO} waiting", "B"),
        ],
    ), 12, 8)

    g.add(ts(
        "Speculative decoding acceptance",
        "Accepted / proposed draft tokens over $window (rooflight_spec_decode_acceptance_ratio: vLLM, TRT-LLM, "
        "llama.cpp with a draft model or n-gram speculation), per pod. Every rejected draft token is decode work "
        "thrown away: when it reads low, propose fewer speculative tokens, pick a draft closer to the model, or "
        "turn speculation off for this traffic; a drop after a prompt-mix change means the draft no longer "
        "matches. Under speculation ITL counts per output event, which can carry several tokens. Blank when the "
        "engine does not speculate.",
        "percentunit", [query(f"{n.SPEC_DECODE_ACCEPTANCE}{sel(WINDOWED)}", WHO, "A")], max_val=1,
    ), 24, 8)

    _capacity_row(g)

    g.row("Requests")
    g.add(ts(
        "Prompt length p50 / p90 / p99",
        "Prompt tokens per request, the agent's percentiles over $window from the engine's prompt-length histogram "
        "(rooflight_request_prompt_tokens: vLLM, TGI, SGLang with --collect-tokens-histogram), per pod. Prefill "
        "time grows with it (compute-bound past the ridge: ~295 tokens on an H100), and a long tail here is what "
        "head-of-line blocking and TTFT burn are made of; with a per-step token budget (Engine settings) smaller "
        "than the p90 prompts, admission waits on prefill.",
        "short", _percentiles(n.REQUEST_PROMPT_TOKENS, "prompt"),
    ), 12, 8)
    g.add(ts(
        "Output length p50 / p90 / p99",
        "Generated tokens per request, the agent's percentiles over $window from the engine's output-length "
        "histogram (rooflight_request_output_tokens), per pod. Long outputs keep sequences decoding, and their KV "
        "growing, for longer: they fill the KV cache (the capacity-capped batch) and lower decode intensity as "
        "each sequence's KV grows.",
        "short", _percentiles(n.REQUEST_OUTPUT_TOKENS, "output"),
    ), 12, 8)
    active_alerts(g)

    g.row("Agent and sources")
    g.add(ts(
        "Agent scrape and sources up",
        "Is each pod's agent scraped, and is each of its sources answering? 'agent scrape' is Prometheus' up "
        "for the agents seen in the last hour (0: the agent itself is down or unreachable, and every other panel "
        "goes blank for that pod); the sources are the agent's own rooflight_source_up: engine (its /metrics), "
        "nvml (the GPUs), process. An engine at 0 for 2 minutes is RooflightEngineDown, nvml for 5 RooflightGPUDown.",
        "short", [
            query(f"up{sel(SCRAPE)} and on ({BY_SCRAPE}) max_over_time({n.BUILD_INFO}{sel(SCRAPE)}[1h])",
                  "{{pod}} agent scrape {{instance}}", "A"),
            query(f"{n.SOURCE_UP}{sel(SCRAPE)}", "{{pod}} {{source}} {{target}}", "B"),
        ], max_val=1,
    ), 12, 8)
    g.add(ts(
        "Source errors per second by reason",
        "Failed samples per second of each source, by reason, per pod: refused (the engine is gone or not "
        "listening yet), timeout (hung or overloaded), http_status (wrong path or port), parse (an engine upgrade "
        "changed its exposition), nvml (the driver or device access). Flat at 0 is good; the reason says where to "
        "look next.",
        "short", [query(f"sum by ({BY_SCRAPE}, source, target, reason) "
                        f"(rate({n.SOURCE_ERRORS}{sel(SCRAPE)}{_RI}))", "{{pod}} {{source}} {{reason}}", "A")],
    ), 12, 8)

    variables = engine_variables() + [
        custom_variable("ttft_slo", "TTFT SLO (s)", TTFT_SLO_BUCKETS, TTFT_SLO_DEFAULT,
                        "TTFT threshold; one of the engine's histogram bucket bounds. Default: the TTFT burn alerts'."),
        custom_variable("itl_slo", "ITL SLO (s)", ITL_SLO_BUCKETS, ITL_SLO_DEFAULT,
                        "ITL threshold; one of the engine's histogram bucket bounds. Default: the ITL burn alerts'."),
    ]
    return build(UID, "Rooflight / Serving overview",
                 "SLO attainment and burn rate, TTFT/ITL percentiles, head-of-line blocking, per-phase "
                 "throughput, the queue, capacity and saturation, and request lengths, per pod.", variables, g)
