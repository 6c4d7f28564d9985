"""KV cache and batch: is the batch capped by memory (the KV wall), by its configured cap, or by admission?

The KV cache decides batch size and batch size decides decode throughput. Occupancy pinned near 100% with
preemptions climbing means the batch is capacity-capped; a queue while the batch sits below its cap with KV
room left means admission (or a token budget) binds instead. The prefix-cache hit rate says how much of
the prompts' KV is reused rather than prefilled and stored again. The engine's settings table shows the
levers the runbooks name (KV pool size, block size, the scheduler's token budgets) at their current values,
where the engine tells them.
"""

from __future__ import annotations

from typing import Any

from rooflight.agent.metrics import names as n
from rooflight.agent.signals.detectors.capacity_capped import KV_BATCH_PANEL

from .panels import (
    BY_SERIES,
    ENGINE,
    MODEL,
    WHO,
    WINDOWED,
    Grid,
    build,
    detector_panel,
    engine_variables,
    info_table,
    kv_pool_bytes,
    query,
    sel,
    ts,
)

UID = "rooflight-kv-batch"

# Columns of the settings table that say nothing there: the instant, the info metric's value 1, its name,
# and the agent's own scrape (job, instance: the pod names it already).
_SETTINGS_HIDDEN = ("Time", "Value", "__name__", "job", "instance")


def _kv_transfer_row(g: Grid) -> None:
    """Prefill/decode disaggregation: the KV the decode pool receives over its connector, and how fast."""
    g.row("KV transfer (disaggregated prefill/decode)")
    g.add(ts(
        "KV transfer intake",
        "Prompt tokens per second whose KV cache arrived from a prefill instance over the KV connector instead "
        "of being prefilled here (rooflight_kv_transfer_tokens_per_second: vLLM's prompt tokens by source "
        "external_kv_transfer), over $window, per pod. On a decode pool it should follow the request rate; "
        "falling to 0 while requests keep arriving means transfers fail or the connector is misconfigured: "
        "prompts are prefilled here instead (Tokens/s on the overview) or wait (the deferred reason in Waiting "
        "requests by reason). 0 on an engine that serves both phases.",
        "short", [query(f"{n.KV_TRANSFER_TOKENS}{sel(WINDOWED)}", WHO, "A")],
    ), 8, 8)
    g.add(ts(
        "KV transfer bandwidth",
        "KV bytes per second the connector delivered (those tokens x K+V bytes per token, all TP ranks: "
        "rooflight_kv_transfer_bytes_per_second) and the mean speed of one transfer as the engine measures it "
        "(rooflight_kv_transfer_speed_bytes_per_second, SGLang), per pod. A per-transfer speed far below the "
        "interconnect's (NVLink, RDMA) points at the transport (TCP fallback, a congested NIC), not the engine.",
        "Bps", [
            query(f"{n.KV_TRANSFER_BYTES}{sel(WINDOWED)}", f"{WHO} delivered", "A"),
            query(f"{n.KV_TRANSFER_SPEED}{sel(WINDOWED)}", f"{WHO} per transfer", "B"),
        ],
    ), 8, 8)
    g.add(ts(
        "KV transfer latency",
        "Mean time of one KV transfer between prefill and decode instances over $window, as the engine measures "
        "it (rooflight_kv_transfer_latency_seconds, SGLang), per pod. It adds to every request's TTFT on a "
        "disaggregated pool: rising with a flat prompt length means the transport or the prefill side's send "
        "queue is the bottleneck. Blank where the engine reports no transfer times (vLLM).",
        "s", [query(f"{n.KV_TRANSFER_LATENCY}{sel(WINDOWED)}", WHO, "A")],
    ), 8, 8)
    g.add(ts(
        "KV transfer failures",
        "KV transfers between prefill and decode instances that failed, per second over the dashboard's rate "
        "interval (rooflight_kv_transfer_failures_total: vLLM's NIXL connector, SGLang), per pod. Each one is a "
        "prompt prefilled again on the decode side or a request that fails: any steady rate is an incident of "
        "the transport (RDMA, NIXL agents, a prefill pod gone), not of the engine. Blank where the engine "
        "does not count them (no connector, or one that keeps no counter).",
        "short", [query(f"rate({n.KV_TRANSFER_FAILURES}{sel(ENGINE)}[$__rate_interval])", WHO, "A")],
    ), 24, 6)


def dashboard() -> dict[str, Any]:
    g = Grid()
    g.row("KV cache")
    g.add(ts(
        "KV cache occupancy",
        "Share of the engine's KV pool (paged blocks) holding live tokens, from the engine's own counters, per "
        "pod (GPU memory used cannot show this: engines preallocate the pool). Pinned near 100% with "
        "preemptions climbing means the batch is capacity-capped: the memory wall, not the scheduler.",
        "percentunit", [query(f"{n.KV_USAGE}{sel(ENGINE)}", WHO, "A")],
        max_val=1, thresholds=[(None, "transparent"), (0.95, "red")],
    ), 8, 8)
    g.add(ts(
        "Preemptions per minute",
        "Sequences evicted from the KV cache (to be recomputed or swapped back) per minute, over $window, per "
        "pod. Any sustained nonzero rate says the KV budget, not the scheduler, is the binding constraint; a "
        "preempted sequence pays its prefill again.",
        "short", [query(f"60 * {n.PREEMPTIONS_PER_SECOND}{sel(WINDOWED)}", WHO, "A")],
    ), 8, 8)
    g.add(ts(
        "Prefix-cache hit rate",
        "Share of prompt tokens found in the engine's prefix cache instead of being prefilled again, over $window, "
        "per pod (rooflight_prefix_cache_hit_ratio: vLLM's prefix_cache_hits / queries, SGLang's cached / all "
        "prefill tokens, llama.cpp's cached prompt tokens; SGLang before 2025 only gives its last batch's rate). A "
        "shared system prompt or multi-turn chat should read high; near 0 with such traffic means prefix caching "
        "is off (enable_prefix_caching in Engine settings) or the router spreads a conversation's turns over "
        "replicas. Blank for a window without prefills. Hits are not counted in the computed prompt tokens that "
        "prefill MFU uses.",
        "percentunit", [query(f"{n.PREFIX_CACHE_HIT_RATIO}{sel(WINDOWED)}", WHO, "A")], max_val=1,
    ), 8, 8)

    g.row("Batch")
    g.add(ts(
        "Batch occupancy against its cap",
        "Running sequences (the continuous batch) against the engine's configured cap (max_num_seqs or its "
        "equivalent) and the KV ceiling: the batch the KV pool could hold at today's mean context "
        "(running / KV occupancy), per pod. Whichever line the batch presses against is what binds it.",
        "short", [
            query(f"{n.REQUESTS_RUNNING}{sel(ENGINE)}", f"{WHO} running", "A"),
            query(f"{n.BATCH_MAX_REQUESTS}{sel(ENGINE)}", f"{WHO} cap", "B"),
            query(f"{n.REQUESTS_RUNNING}{sel(ENGINE)} / ({n.KV_USAGE}{sel(ENGINE)} > 0)", f"{WHO} KV ceiling", "C"),
        ],
    ), 12, 8)
    g.add(ts(
        "Batch occupancy ratio",
        "Running / batch cap, per pod. If it never nears 1 while the queue is nonempty, something upstream "
        "(admission, KV, token budget) is binding, not the cap.",
        "percentunit", [query(f"{n.BATCH_OCCUPANCY}{sel(ENGINE)}", WHO, "A")], max_val=1,
    ), 12, 8)
    g.add(ts(
        "Waiting requests by reason",
        "Queued requests split by why they wait, where the engine says (vLLM: capacity = waiting for KV or a "
        "batch slot, deferred = LoRA budget, KV transfer or other), per pod. A queue waiting on KV is the memory "
        "wall; deferred requests point at adapters or a disaggregated KV transfer.",
        "short", [
            query(f"sum by ({BY_SERIES}, reason) ({n.REQUESTS_WAITING_BY_REASON}{sel(ENGINE)})",
                  f"{WHO} {{{{reason}}}}", "A"),
            query(f"{n.REQUESTS_WAITING}{sel(ENGINE)}", f"{WHO} all waiting", "B"),
        ],
    ), 12, 8)
    g.add(detector_panel(
        "kv-batch", KV_BATCH_PANEL,
        "The agent's detectors, 1 while true, per pod: capacity-capped (KV full, preempting, queue nonempty), "
        "at configured max (running = cap with KV room left: raise the cap), admission-bound (queue nonempty, "
        "batch below cap, KV has room: the scheduler or token budget binds).",
    ), 12, 8)

    g.row("KV bytes")
    g.add(ts(
        "Live KV bytes vs the KV pool",
        "Live KV = occupancy x capacity x bytes per token (K and V, every layer); the pool = capacity x bytes per "
        "token, per pod. Every byte shaved off a token's cache (GQA, FP8 KV) converts directly into batch.",
        "bytes", [
            query(f"{n.KV_LIVE_BYTES}{sel(ENGINE)}", f"{WHO} live", "A"),
            query(kv_pool_bytes(ENGINE, MODEL), f"{WHO} pool", "B"),
        ],
    ), 24, 8)

    _kv_transfer_row(g)

    g.row("Engine settings")
    g.add(info_table(
        "Engine settings",
        "The memory and scheduler settings each pod's engine tells, one row per pod, model and rank, in the "
        "engine's own spelling (rooflight_engine_config_info; docs/engines.md, section Engine settings): vLLM "
        "block_size, gpu_memory_utilization, num_gpu_blocks, enable_prefix_caching, max_model_len; SGLang "
        "chunked_prefill_size, max_prefill_tokens, max_running_requests, mem_fraction_static; TGI's router limits; "
        "llama.cpp total_slots and n_ctx. The prefill lever of head-of-line blocking is here where the engine "
        "tells it (SGLang chunked_prefill_size); vLLM's max_num_batched_tokens, TGI's max_batch_prefill_tokens and "
        "llama.cpp's ubatch size are on no endpoint: read them from the engine's command line. An empty cell: that "
        "engine does not state the setting.",
        query(f"{n.ENGINE_CONFIG_INFO}{sel(ENGINE)}", WHO, "A", instant=True, table=True),
        _SETTINGS_HIDDEN,
    ), 24, 6)
    return build(UID, "Rooflight / KV cache and batch",
                 "KV occupancy, preemptions, prefix-cache hits, batch against its cap and the KV ceiling on "
                 "concurrency, KV transfers between prefill and decode pools, and the engine's memory and "
                 "scheduler settings, per pod.", engine_variables(), g)
