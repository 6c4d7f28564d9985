"""Fleet: each service's models as one pool, from the fleet recording rules, with what the pool costs.

The other dashboards are per pod; a capacity or cost decision is per pool. This one reads the rules'
fleet records (rules/recording.py, rules/capacity.py: per model, summed over replicas within one cluster,
namespace and job, so prod and staging never add up), the agent's cost signals per pod, and the SLO burn
row the overview shows (dashboards/shared.py). Record names come from the rule modules' own builders.
"""

from __future__ import annotations

from typing import Any

from rooflight.agent.metrics import names as n
from rooflight.rules import capacity, recording
from rooflight.rules.promql import record_name, window_suffix

from .panels import (
    FLEET,
    FLEET_WHO,
    WHO,
    WINDOWED,
    Grid,
    build,
    engine_variables,
    fleet,
    query,
    sel,
    ts,
)
from .shared import RULES, active_alerts, slo_row

UID = "rooflight-fleet"

_RATE = window_suffix(RULES.rate_window)
TOKENS = recording.fleet_tokens_record(RULES)
MBU = record_name(("model",), "rooflight_mbu", f"ratio_rate{_RATE}")
MFU = record_name(("model", "phase"), "rooflight_mfu", f"ratio_rate{_RATE}")
SATURATION_AVG = capacity.fleet_saturation_record(RULES, "avg")
SATURATION_MAX = capacity.fleet_saturation_record(RULES, "max")
GROUPS_NEEDED = capacity.groups_needed_record(RULES)
GPU_HOUR_COST = capacity.fleet_cost_record(RULES)
COST_PER_MILLION = capacity.cost_per_million_record(RULES)


def _fleet(record: str, legend: str, ref: str) -> Any:
    return query(fleet(f"{record}{sel(FLEET)}"), legend, ref)


def _pool_row(g: Grid) -> None:
    g.row("Pool throughput and utilization")
    g.add(ts(
        "Pool tokens/s by phase",
        f"Prompt (prefill) and generated (decode) tokens per second of each model's pool over {RULES.rate_window}, "
        f"summed over its replicas ({TOKENS}), per cluster and namespace. Compare with the groups each phase "
        "needs (Capacity row): tokens/s rising while groups needed stays put means the pool has room.",
        "short", [_fleet(TOKENS, f"{FLEET_WHO} {{{{phase}}}}", "A")],
    ), 8, 8)
    g.add(ts(
        "Pool decode MBU",
        f"The pool's decode MBU over {RULES.rate_window}: bytes decode streamed over the peak HBM bandwidth of "
        f"every GPU in it ({MBU}). 60-80% is a healthy decode; a pool far lower than its best pod's MBU (Roofline "
        "dashboard) has idle or under-batched replicas: consolidate before adding GPUs.",
        "percentunit", [_fleet(MBU, FLEET_WHO, "A")], max_val=1,
        thresholds=[(None, "transparent"), (0.6, "green")],
    ), 8, 8)
    g.add(ts(
        "Pool MFU by phase",
        f"The pool's MFU per phase over {RULES.rate_window} ({MFU}): FLOPs the tokens took over the peak of every "
        "GPU in the pool. Judge prefill by it (40-60% is strong); decode MFU is small by nature. Prefill MFU low "
        "while the TTFT burns points at queueing or admission rather than compute (Pool saturation, and the "
        "overview's Queue time vs prefill time).",
        "percentunit", [_fleet(MFU, f"{FLEET_WHO} {{{{phase}}}}", "A")], max_val=1,
    ), 8, 8)


def _capacity_row(g: Grid) -> None:
    g.row("Pool capacity")
    g.add(ts(
        "Pool saturation by role",
        f"Saturation of each model's pool per role over {RULES.saturation_window}: the mean of its ranks "
        f"({SATURATION_AVG}, what the autoscaling examples steer to their threshold) and its hottest rank "
        f"({SATURATION_MAX}). 1 (red line) is the first wall. Mean far below the hottest: the load is unevenly "
        "spread (router, session affinity), fix that before scaling; the mean held above the threshold: the "
        "pool is not getting the replicas it asks for (the autoscaler's max, quota, free GPUs).",
        "percentunit", [
            _fleet(SATURATION_AVG, f"{FLEET_WHO} {{{{role}}}} mean", "A"),
            _fleet(SATURATION_MAX, f"{FLEET_WHO} {{{{role}}}} worst", "B"),
        ], thresholds=[(None, "transparent"), (1.0, "red")],
    ), 12, 8)
    g.add(ts(
        "Groups needed by phase",
        f"The pool's tokens/s per phase over what one group of that phase carries alone ({GROUPS_NEEDED}: the "
        f"agents' capacity_phase_tokens_per_second over their {RULES.capacity_window} window), per model: how many prefill and decode "
        "groups (model copies) today's load needs. Above the groups you run: scale that phase; far below: "
        "shrink it, or move GPUs to the other phase in a disaggregated deployment.",
        "short", [_fleet(GROUPS_NEEDED, f"{FLEET_WHO} {{{{phase}}}}", "A")],
    ), 12, 8)


def _cost_row(g: Grid) -> None:
    g.row("Cost")
    g.add(ts(
        "Cost per million tokens by phase",
        "What a million tokens of each phase cost over $window (rooflight_cost_per_million_tokens: the GPU-hour "
        "price x GPUs x the phase's share of GPU time / its tokens), per pod, in the currency of "
        "--gpu-hour-cost; blank where it is not set. Decode is usually the dear phase: a bigger batch (higher "
        "MBU) lowers it, as do shorter outputs; a phase dearer on one pod than on its peers is idle there.",
        "short", [query(f"{n.COST_PER_MILLION_TOKENS}{sel(WINDOWED)}", f"{WHO} {{{{phase}}}}", "A")],
    ), 8, 8)
    g.add(ts(
        "Blended cost per million tokens",
        "A million tokens of the current prompt/output mix (rooflight_blended_cost_per_million_tokens: GPU-hour "
        f"price x GPUs / all tokens), per pod, and per model's pool over {RULES.rate_window} and phase "
        f"({COST_PER_MILLION}). Compare pods of one model: the dearest is the least busy. A rise at steady price "
        "is idle GPU time: consolidate or scale in.",
        "short", [
            query(f"{n.BLENDED_COST_PER_MILLION_TOKENS}{sel(WINDOWED)}", f"{WHO} blended", "A"),
            _fleet(COST_PER_MILLION, f"{FLEET_WHO} pool {{{{phase}}}}", "B"),
        ],
    ), 8, 8)
    g.add(ts(
        "GPU time share by phase",
        "Each phase's share of the GPU time its work took over $window (rooflight_gpu_time_share_ratio; the "
        "phases add up to 1), per pod: how the GPU-hour splits between prefill and decode, the split the cost "
        "per phase uses. A prefill share growing on an aggregated engine is what disaggregation (a prefill "
        "pool) would take off the decode GPUs.",
        "percentunit", [query(f"{n.GPU_TIME_SHARE}{sel(WINDOWED)}", f"{WHO} {{{{phase}}}}", "A")], max_val=1,
    ), 8, 8)
    g.add(ts(
        "Pool GPU spend per hour",
        f"The configured GPU-hour price x the GPUs of every replica of each model's pool ({GPU_HOUR_COST}), per "
        "cluster and namespace: what the pool costs per hour whatever it serves. Read it with Pool saturation: "
        "a costly pool at low saturation is where scaling in saves most.",
        "short", [_fleet(GPU_HOUR_COST, FLEET_WHO, "A")],
    ), 24, 6)


def dashboard() -> dict[str, Any]:
    g = Grid()
    _pool_row(g)
    _capacity_row(g)
    slo_row(g)
    _cost_row(g)
    g.row("Alerts")
    active_alerts(g)
    return build(UID, "Rooflight / Fleet",
                 "Each model's pool from the fleet recording rules: tokens/s, MBU and MFU, saturation and groups "
                 "needed, SLO burn and error budget, and cost per token and per hour.", engine_variables(), g)
