"""Capacity and cost recording rules: the signal an autoscaler scales a pool on, the groups each phase
needs for the fleet's traffic, and what a model's tokens cost across the fleet.

The agent exports, per target and window (docs/metrics.md, section Capacity, cost and energy),
`rooflight_saturation_ratio{role}` (1 - the smallest headroom among the walls of the target's role),
`rooflight_capacity_phase_tokens_per_second{phase}` (what one group of that phase carries),
`rooflight_gpu_time_share_ratio{phase}` (the phase's share of the rank's GPU time) and
`rooflight_gpu_hour_cost{target}` (the configured price of one GPU-hour). From them:

    per rank   target_engine_model_rank_role:rooflight_saturation:max1m
                   = max_over_time(saturation{window="1m"}[1m]): the pool's steady state
    fleet      model_role:rooflight_saturation:avg1m, :max1m    the pool's mean and its hottest rank
    per rank   target_engine_model_rank_role:rooflight_saturation_demand:max1m
                   = max_over_time(saturation_demand{window="1m"}[1m]): what KEDA and an HPA scale on;
                     the saturation while nothing queues, past 1 with the queue behind the wall
    fleet      model_role:rooflight_saturation_demand:avg1m, :sum1m
                   the pool's mean (what its autoscaler steers to) and its walls' worth of work: ceil() of
                   the sum / the target is the pods an HPA asks for
    fleet      model_phase:rooflight_groups_needed:rate5m
                   = the model's tokens/s of the phase / the mean capacity per group of that phase
    per rank   target_engine_model_rank:rooflight_gpu_hour_cost:sum = price per GPU-hour x TP
    fleet      model:rooflight_gpu_hour_cost:sum                 what the model's GPUs cost per hour
    fleet      model_phase:rooflight_cost_per_million_tokens:rate5m
                   = sum of the priced ranks' cost per hour x their share of GPU time in the phase
                     / (their tokens/s of the phase x 3600 / 1e6)

Saturation is a min over headrooms, not a ratio of sums, so the fleet's mean of it is meaningful (the
HPA's own arithmetic averages it over pods). Capacity and cost are built like MBU in rules/recording.py:
numerators and denominators summed separately. The cost charges each phase its share of every rank's
GPU-hour (`rooflight_gpu_time_share_ratio{phase}` over capacity_window), as the agent's
`rooflight_cost_per_million_tokens{phase}` does, so the phases' bills add up to the fleet's; it counts only
the tokens of ranks that have a price and a share (a rank without `gpu_hour_cost` would otherwise lower the
price of everyone's tokens).

Per-rank rules keep the scrape's topology labels (RulesConfig.kept_labels), as every rule does; the
fleet rules aggregate the replicas away by model, on purpose, within one service scope (cluster,
namespace: RulesConfig.service_labels), so prod and staging never average into one. docs/deploy.md
(section Autoscaling) explains the thresholds the deploy/k8s/autoscaling examples put on the saturation
demand record, and docs/physics.md (section Demand past the wall) why it counts the queue.
"""

from __future__ import annotations

from rooflight.agent.metrics import names
from rooflight.rules.config import RulesConfig
from rooflight.rules.promql import labels, record_name, series, window_suffix
from rooflight.rules.recording import (
    AGENT_LABELS,
    Rule,
    fleet_by,
    fleet_tokens_record,
    keep,
    rank_labels,
    tokens_record,
)

ROLE_LEVEL = (*AGENT_LABELS, "role")  # the per-rank record's level: the saturation is per role


def saturation_record(config: RulesConfig) -> str:
    """The per-rank autoscaling signal: the agent's saturation over `saturation_window`, its max over as long."""
    return record_name(ROLE_LEVEL, "rooflight_saturation", f"max{window_suffix(config.saturation_window)}")


def fleet_saturation_record(config: RulesConfig, how: str) -> str:
    """The pool's `avg` or `max` saturation by model and role."""
    return record_name(("model", "role"), "rooflight_saturation", f"{how}{window_suffix(config.saturation_window)}")


def demand_record(config: RulesConfig) -> str:
    """The per-rank burst signal: the agent's saturation demand over `saturation_window`, its max over as long."""
    return record_name(ROLE_LEVEL, "rooflight_saturation_demand", f"max{window_suffix(config.saturation_window)}")


def fleet_demand_record(config: RulesConfig, how: str) -> str:
    """The pool's `avg` or `sum` saturation demand by model and role."""
    return record_name(("model", "role"), "rooflight_saturation_demand",
                       f"{how}{window_suffix(config.saturation_window)}")


def groups_needed_record(config: RulesConfig) -> str:
    return record_name(("model", "phase"), "rooflight_groups_needed", f"rate{window_suffix(config.rate_window)}")


def rank_cost_record(config: RulesConfig) -> str:
    """A rank's GPUs' price per hour: the price of one GPU-hour x TP (as the peaks are summed per rank)."""
    return record_name(rank_labels(config), names.GPU_HOUR_COST, "sum")


def fleet_cost_record(config: RulesConfig) -> str:
    return record_name(("model",), names.GPU_HOUR_COST, "sum")


def cost_per_million_record(config: RulesConfig) -> str:
    rate = f"rate{window_suffix(config.rate_window)}"
    return record_name(("model", "phase"), "rooflight_cost_per_million_tokens", rate)


def _record(name: str, expr: str) -> Rule:
    return {"record": name, "expr": expr}


def saturation_rules(config: RulesConfig) -> list[Rule]:
    """Per rank, then the pool's mean and maximum by model and role."""
    w = config.saturation_window
    per_rank = saturation_record(config)
    source = series(names.SATURATION, config.agent_selector, f'window="{w}"')
    return [
        _record(per_rank, f"max by ({labels(keep(config, *ROLE_LEVEL))}) (\n  max_over_time({source}[{w}])\n)"),
        _record(fleet_saturation_record(config, "avg"), f"avg by ({fleet_by(config, 'model', 'role')}) ({per_rank})"),
        _record(fleet_saturation_record(config, "max"), f"max by ({fleet_by(config, 'model', 'role')}) ({per_rank})"),
    ]


def demand_rules(config: RulesConfig) -> list[Rule]:
    """Per rank as the saturation record, then the pool's mean and sum by model and role (one service
    scope: fleet_by), so prod's queue never asks for staging's pods."""
    w = config.saturation_window
    per_rank = demand_record(config)
    source = series(names.SATURATION_DEMAND, config.agent_selector, f'window="{w}"')
    by = fleet_by(config, "model", "role")
    return [
        _record(per_rank, f"max by ({labels(keep(config, *ROLE_LEVEL))}) (\n  max_over_time({source}[{w}])\n)"),
        _record(fleet_demand_record(config, "avg"), f"avg by ({by}) ({per_rank})"),
        _record(fleet_demand_record(config, "sum"), f"sum by ({by}) ({per_rank})"),
    ]


def groups_needed_rule(config: RulesConfig) -> Rule:
    """The model's tokens/s of each phase over the mean capacity of one group of that phase (idle groups
    that report no capacity left out): `ceil()` of it is `rooflight plan`'s pool size."""
    capacity = series(names.CAPACITY_PHASE_TOKENS, config.agent_selector, f'window="{config.capacity_window}"')
    return _record(
        groups_needed_record(config),
        f"{fleet_tokens_record(config)}\n/ on ({fleet_by(config, 'model', 'phase')})\n"
        f"avg by ({fleet_by(config, 'model', 'phase')}) ({capacity} > 0)",
    )


def cost_rules(config: RulesConfig) -> list[Rule]:
    """Per-rank price per hour, the model's per hour, and its cost per million tokens by phase."""
    sel = config.agent_selector
    by_rank = labels(keep(config, *rank_labels(config)))
    on_target = labels(keep(config, "target"))
    on_model = labels(keep(config, "target", "model"))
    by_rank_phase = labels(keep(config, *rank_labels(config), "phase"))
    rank_cost, fleet_cost = rank_cost_record(config), fleet_cost_record(config)
    share = series(names.GPU_TIME_SHARE, sel, f'window="{config.capacity_window}"')
    priced_tokens = (f"{tokens_record(config)}\n    and on ({by_rank}) {rank_cost}\n"
                     f"    and on ({by_rank_phase}) {share}")
    phase_cost = f"sum by ({fleet_by(config, 'model', 'phase')}) (\n  {rank_cost}\n  * on ({by_rank}) group_right {share}\n)"
    return [
        _record(
            rank_cost,
            f"group by ({by_rank}) ({series(names.GENERATION_TOKENS, sel)})\n"
            f"* on ({on_target}) group_left max by ({on_target}) ({series(names.GPU_HOUR_COST, sel)})\n"
            f"* on ({on_model}) group_left max by ({on_model}) ({series(names.TENSOR_PARALLEL_SIZE, sel)})",
        ),
        _record(fleet_cost, f"sum by ({fleet_by(config, 'model')}) ({rank_cost})"),
        # Written constant / tokens * cost: `cost / on (model) group_right (...)` would read the
        # parenthesis as group_right's label list. Each rank's GPU-hour is split over the phases by its
        # share of GPU time, so the phases' bills add up to the fleet's (docs/physics.md, section Cost and
        # energy split by GPU time); a rank that exports no share is left out of both sides.
        _record(
            cost_per_million_record(config),
            f"1e6 / 3600\n/ (\n  sum by ({fleet_by(config, 'model', 'phase')}) (\n    {priced_tokens}\n  )\n  > 0\n)\n"
            f"* on ({fleet_by(config, 'model', 'phase')}) {phase_cost}",
        ),
    ]


def capacity_rules(config: RulesConfig) -> list[Rule]:
    """Saturation, its demand, groups needed and cost, in dependency order."""
    return [*saturation_rules(config), *demand_rules(config), groups_needed_rule(config), *cost_rules(config)]
