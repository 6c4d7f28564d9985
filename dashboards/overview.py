"""Serving overview: is the service meeting its latency SLOs, and is each phase keeping up?

TTFT belongs to prefill (plus queueing), ITL to decode; throughput is shown per phase, never combined,
because a combined number hides the phase split every diagnosis starts from.
"""

from __future__ import annotations

from typing import Any

from rooflight.agent.metrics import names as n

from .panels import ENGINE, VLLM, WINDOWED, Grid, build, custom_variable, engine_variables, query, sel, single, ts

UID = "rooflight-overview"

# SLO thresholds must be bucket boundaries the engine exposes (vLLM's TTFT and ITL buckets, spelled as
# vLLM writes them); a threshold between buckets would silently match nothing.
TTFT_SLO_BUCKETS = ["0.1", "0.25", "0.5", "0.75", "1.0", "2.5", "5.0"]
ITL_SLO_BUCKETS = ["0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.5"]

_TTFT_B = "vllm:time_to_first_token_seconds_bucket"
_TTFT_C = "vllm:time_to_first_token_seconds_count"
_ITL_B = "vllm:inter_token_latency_seconds_bucket"
_ITL_C = "vllm:inter_token_latency_seconds_count"
_RI = "[$__rate_interval]"


def _attainment(bucket: str, count: str, slo_var: str) -> str:
    good = f"sum(rate({bucket}{sel(VLLM, le=f'${slo_var}')}{_RI}))"
    return f"{good} / sum(rate({count}{sel(VLLM)}{_RI}))"


def _engine_quantile(q: str, bucket: str) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({bucket}{sel(VLLM)}{_RI})))"


def dashboard() -> dict[str, Any]:
    g = Grid()
    g.row("SLOs and goodput")
    req_rate = f"sum(rate(vllm:request_success_total{sel(VLLM)}{_RI}))"
    g.add(single(
        "TTFT SLO attainment",
        "Share of requests whose time to first token (queueing + the whole prefill) met $ttft_slo s, from the "
        "engine's TTFT histogram. Below the SLO target: prefill is queueing or a long prompt is blocking the line.",
        "percentunit", query(_attainment(_TTFT_B, _TTFT_C, "ttft_slo"), "TTFT <= $ttft_slo s", "A", instant=True),
        thresholds=[(None, "red"), (0.9, "orange"), (0.99, "green")], decimals=1,
    ), 6, 5)
    g.add(single(
        "ITL SLO attainment",
        "Share of inter-token gaps at or under $itl_slo s (per token, not per request). Decode sets ITL: a low "
        "value with a steady median is stutter, usually head-of-line blocking by long prefills.",
        "percentunit", query(_attainment(_ITL_B, _ITL_C, "itl_slo"), "ITL <= $itl_slo s", "A", instant=True),
        thresholds=[(None, "red"), (0.9, "orange"), (0.99, "green")], decimals=1,
    ), 6, 5)
    g.add(single(
        "Goodput bound (req/s meeting TTFT SLO)",
        "Finished requests per second times TTFT attainment: an upper bound on goodput, the requests/s that meet "
        "both the TTFT and ITL SLOs. Raising batch raises tokens/s but can lower this; optimize this number.",
        "reqps", query(f"{req_rate} * ({_attainment(_TTFT_B, _TTFT_C, 'ttft_slo')})", "goodput bound", "A",
                       instant=True), decimals=2,
    ), 6, 5)
    g.add(single(
        "Firing Rooflight alerts",
        "How many Rooflight alerts fire now (head-of-line blocking, capacity-capped batch, SLO burn, low decode "
        "MBU, engine or GPU down). The table below names them.",
        "none", query('count(ALERTS{alertname=~"Rooflight.*", alertstate="firing"}) or vector(0)', "firing", "A",
                      instant=True), thresholds=[(None, "green"), (1, "red")],
    ), 6, 5)

    g.row("Latency")
    g.add(ts(
        "TTFT p50 / p90 / p99",
        "Time to first token: queueing plus the entire prefill, the agent's percentiles over $window from the "
        "engine's histogram deltas; 'engine histogram p99' is the engine's own p99 at Prometheus resolution. A rising p99 "
        "with a flat p50 is queueing or long prompts; all three rising is prefill capacity.",
        "s", [
            query(f"{n.TTFT}{sel(WINDOWED)}", "p{{percentile}} {{model}} r{{rank}}", "A"),
            query(_engine_quantile("0.99", _TTFT_B), "engine histogram p99", "B"),
        ],
    ), 12, 8)
    g.add(ts(
        "ITL p50 / p99 (agent, 10 s window)",
        "Inter-token latency, the gap between streamed tokens, from the agent's 10 s window (higher resolution "
        "than a Prometheus rate). p99 spiking while p50 stays flat, in step with long-prompt arrivals, is the "
        "head-of-line signature: a prefill stalled every in-flight decode. 'engine histogram p99' is the same from Prometheus.",
        "s", [
            query(n.ITL + sel(ENGINE + ', percentile=~"50|99"', window="10s"),
                  "p{{percentile}} {{model}} r{{rank}}", "A"),
            query(_engine_quantile("0.99", _ITL_B), "engine histogram p99", "B"),
        ],
    ), 12, 8)

    g.row("Throughput and queue")
    g.add(ts(
        "Tokens/s: prefill and decode",
        "Prompt (prefill, compute-bound) and generated (decode, bandwidth-bound) tokens per second over $window, "
        "never combined. Prefill scales with FLOP/s, decode with batch; judge them with MFU and MBU respectively.",
        "short", [query(f"{n.TOKENS_PER_SECOND}{sel(WINDOWED)}", "{{phase}} {{model}} r{{rank}}", "A")],
    ), 12, 8)
    g.add(ts(
        "Requests running / waiting",
        "Running = the continuous batch (sequences decoding together, each step); waiting = queued requests. A "
        "nonempty queue while running sits below its cap means something upstream (admission, KV, token budget) "
        "is binding; see the KV cache and batch dashboard.",
        "short", [
            query(f"{n.REQUESTS_RUNNING}{sel(ENGINE)}", "running {{model}} r{{rank}}", "A"),
            query(f"{n.REQUESTS_WAITING}{sel(ENGINE)}", "waiting {{model}} r{{rank}}", "B"),
        ],
    ), 12, 8)
    g.add(ts(
        "Active Rooflight alerts",
        "Each firing or pending Rooflight alert as a line at 1. Empty is good. The alert names say which limit "
        "binds: HeadOfLineBlocking (prefill stalls decode), BatchCapacityCapped (the KV wall), LowDecodeMBU.",
        "short", [query('ALERTS{alertname=~"Rooflight.*"}', "{{alertname}} {{alertstate}} {{target}}", "A")],
    ), 24, 6)

    variables = engine_variables() + [
        custom_variable("ttft_slo", "TTFT SLO (s)", TTFT_SLO_BUCKETS, "1.0",
                        "TTFT objective; must be one of the engine's histogram bucket bounds."),
        custom_variable("itl_slo", "ITL SLO (s)", ITL_SLO_BUCKETS, "0.1",
                        "ITL objective; must be one of the engine's histogram bucket bounds."),
    ]
    return build(UID, "Rooflight / Serving overview",
                 "SLO attainment, TTFT/ITL percentiles, per-phase throughput and the queue.", variables, g)
