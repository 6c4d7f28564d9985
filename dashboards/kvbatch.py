"""KV cache and batch: is the batch capped by memory (the KV wall), by its configured cap, or by admission?

The KV cache decides batch size and batch size decides decode throughput. Occupancy pinned near 100% with
preemptions climbing means the batch is capacity-capped; a queue while the batch sits below its cap with KV
room left means admission (or a token budget) binds instead.
"""

from __future__ import annotations

from typing import Any

from rooflight.agent.metrics import names as n

from .panels import ENGINE, WINDOWED, Grid, build, engine_variables, query, sel, ts

UID = "rooflight-kv-batch"


def dashboard() -> dict[str, Any]:
    g = Grid()
    g.row("KV cache")
    g.add(ts(
        "KV cache occupancy",
        "Share of the engine's KV pool (paged blocks) holding live tokens, from the engine's own counters "
        "(GPU memory used cannot show this: engines preallocate the pool). Pinned near 100% with preemptions "
        "climbing means the batch is capacity-capped: the memory wall, not the scheduler.",
        "percentunit", [query(f"{n.KV_USAGE}{sel(ENGINE)}", "{{model}} r{{rank}}", "A")],
        max_val=1, thresholds=[(None, "transparent"), (0.95, "red")],
    ), 12, 8)
    g.add(ts(
        "Preemptions per minute",
        "Sequences evicted from the KV cache (to be recomputed or swapped back) per minute, over $window. Any "
        "sustained nonzero rate says the KV budget, not the scheduler, is the binding constraint.",
        "short", [query(f"60 * {n.PREEMPTIONS_PER_SECOND}{sel(WINDOWED)}", "{{model}} r{{rank}}", "A")],
    ), 12, 8)

    g.row("Batch")
    g.add(ts(
        "Batch occupancy against its cap",
        "Running sequences (the continuous batch) against the engine's configured cap (max_num_seqs or its "
        "equivalent) and the KV ceiling: the batch the KV pool could hold at today's mean context "
        "(running / KV occupancy). Whichever line the batch presses against is what binds it.",
        "short", [
            query(f"{n.REQUESTS_RUNNING}{sel(ENGINE)}", "running {{model}} r{{rank}}", "A"),
            query(f"{n.BATCH_MAX_REQUESTS}{sel(ENGINE)}", "cap {{model}} r{{rank}}", "B"),
            query(f"{n.REQUESTS_RUNNING}{sel(ENGINE)} / ({n.KV_USAGE}{sel(ENGINE)} > 0)",
                  "KV ceiling {{model}} r{{rank}}", "C"),
        ],
    ), 12, 8)
    g.add(ts(
        "Batch occupancy ratio",
        "Running / batch cap. If it never nears 1 while the queue is nonempty, something upstream (admission, "
        "KV, token budget) is binding, not the cap.",
        "percentunit", [query(f"{n.BATCH_OCCUPANCY}{sel(ENGINE)}", "{{model}} r{{rank}}", "A")], max_val=1,
    ), 12, 8)
    g.add(ts(
        "Waiting requests by reason",
        "Queued requests split by why they wait, where the engine says (e.g. waiting for KV blocks vs for a "
        "batch slot). A queue waiting on KV is the memory wall; a queue waiting on the cap is the configuration.",
        "short", [
            query(f"sum by (target, model, rank, reason) ({n.REQUESTS_WAITING_BY_REASON}{sel(ENGINE)})",
                  "{{reason}} {{model}} r{{rank}}", "A"),
            query(f"{n.REQUESTS_WAITING}{sel(ENGINE)}", "all waiting {{model}} r{{rank}}", "B"),
        ],
    ), 12, 8)
    g.add(ts(
        "What limits the batch (detectors)",
        "The agent's detectors, 1 while true: capacity-capped (KV full, preempting, queue nonempty), "
        "at configured max (running = cap with KV room left: raise the cap), admission-bound (queue nonempty, "
        "batch below cap, KV has room: the scheduler or token budget binds).",
        "short", [
            query(f"{n.BATCH_CAPACITY_CAPPED}{sel(ENGINE)}", "capacity-capped {{model}} r{{rank}}", "A"),
            query(f"{n.BATCH_AT_CONFIGURED_MAX}{sel(ENGINE)}", "at configured max {{model}} r{{rank}}", "B"),
            query(f"{n.BATCH_ADMISSION_BOUND}{sel(ENGINE)}", "admission-bound {{model}} r{{rank}}", "C"),
        ], max_val=1,
    ), 12, 8)

    g.row("KV bytes")
    g.add(ts(
        "Live KV bytes vs the KV pool",
        "Live KV = occupancy x capacity x bytes per token (K and V, every layer); the pool = capacity x bytes per "
        "token. Every byte shaved off a token's cache (GQA, FP8 KV) converts directly into batch.",
        "bytes", [
            query(f"{n.KV_LIVE_BYTES}{sel(ENGINE)}", "live {{model}} r{{rank}}", "A"),
            query(f"{n.KV_CAPACITY_TOKENS}{sel(ENGINE)} * on (target, model) group_left "
                  f"max by (target, model) ({n.MODEL_KV_BYTES_PER_TOKEN})", "pool {{model}} r{{rank}}", "B"),
        ],
    ), 24, 8)
    return build(UID, "Rooflight / KV cache and batch",
                 "KV occupancy, preemptions, batch against its cap and the KV ceiling on concurrency.",
                 engine_variables(), g)
