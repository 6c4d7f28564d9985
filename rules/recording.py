"""Recording rules for MBU, MFU and per-phase tokens/s in PromQL, from the agent's counters.

The agent exports its own windowed ratios, but a ratio cannot be averaged across agents. It also
exports the numerators as counters: the bytes its engine's steps read and the FLOPs by phase, exactly
as its own MBU and MFU count them (agent/signals/derive.py: weights a step touches, live KV by the
engine's KV groups, draft model, expert share; matmuls, attention, prefix-cache hits left out). These
rules rate those counters and divide by the peaks, per rank, and aggregate each side by model, so a
fleet's MBU is sum(bytes/s) / sum(peak bytes/s), never avg(ratio), and a number has one definition:

    MBU        = rate(rooflight_model_streamed_bytes_total) / (peak bandwidth x tp)
    MFU{phase} = rate(rooflight_model_flops_total{phase}) / (peak FLOP/s x tp)

Every per-rank aggregation and join also keeps the scrape's topology labels (RulesConfig.kept_labels:
cluster, namespace, pod, instance, job by default). Two replicas' sidecars both export
target="127.0.0.1:8000" and the same model; without those labels their steps, bytes and peaks would be
summed into one series, reading twice the MBU. Only the fleet rules aggregate the replicas away, by model,
on purpose, keeping the service scope (cluster, namespace: RulesConfig.service_labels).

Names follow level:metric:operations (prometheus.io/docs/practices/rules). The level names the agent's
labels only; the topology labels ride along unnamed (as kubernetes-mixin's `cluster` does), so a name
does not change with a deployment's label config and dashboards and runbooks can rely on it.
"""

from __future__ import annotations

from rooflight.agent.metrics import names
from rooflight.rules.config import RulesConfig
from rooflight.rules.promql import labels, record_name, series, window_suffix

Rule = dict[str, object]

AGENT_LABELS = ("target", "engine", "model", "rank")


def rank_labels(config: RulesConfig) -> tuple[str, ...]:
    """The labels that name the per-rank level in a rule's name (the agent's own, not the scrape's)."""
    return AGENT_LABELS


def keep(config: RulesConfig, *names: str) -> tuple[str, ...]:
    """`names` with the scrape's topology labels in front: the labels a by()/on() clause must list."""
    return (*config.kept_labels, *names)


def fleet_by(config: RulesConfig, *names: str) -> str:
    """A fleet rule's by()/on() list: the service scope (RulesConfig.service_labels: the topology labels
    that do not tell replicas apart, cluster and namespace by default) and `names`. Summing over replicas is
    the point of a fleet rule; summing over clusters or namespaces would add prod to staging."""
    return labels((*config.service_labels, *names))


def _record(name: str, expr: str) -> Rule:
    return {"record": name, "expr": expr}


def recording_rules(config: RulesConfig) -> list[Rule]:
    """Per-rank and per-model MBU, MFU and tokens/s, in dependency order."""
    w = window_suffix(config.rate_window)
    sel = config.agent_selector
    rank = rank_labels(config)
    by_rank = labels(keep(config, *rank))
    on_model = labels(keep(config, "target", "model"))
    on_target = labels(keep(config, "target"))
    rank_phase = (*rank, "phase")

    steps = record_name(rank, "rooflight_engine_steps", f"rate{w}")
    tokens = tokens_record(config)
    kv_live = record_name(rank, names.KV_LIVE_BYTES, f"avg_over_time{w}")
    stream = record_name(rank, "rooflight_model_stream_bytes", f"rate{w}")
    peak_bw = record_name(rank, names.GPU_PEAK_BANDWIDTH, "sum")
    mbu = record_name(rank, "rooflight_mbu", f"ratio_rate{w}")
    flops = record_name(rank_phase, "rooflight_model_flops", f"rate{w}")
    peak_flops = record_name(rank, names.GPU_PEAK_FLOPS, "sum")
    mfu = record_name(rank_phase, "rooflight_mfu", f"ratio_rate{w}")

    def rate(metric: str, by: str = by_rank) -> str:
        return f"sum by ({by}) (rate({series(metric, sel)}[{config.rate_window}]))"

    def const(metric: str, on: str, *extra: str) -> str:
        return f"max by ({on}) ({series(metric, sel, *extra)})"

    # One series per rank with value 1, to hang the per-GPU constants on.
    ranks = f"group by ({by_rank}) ({series(names.ENGINE_STEPS, sel)})"
    tp = const(names.TENSOR_PARALLEL_SIZE, on_model)

    return [
        _record(steps, rate(names.ENGINE_STEPS)),
        _record(
            tokens,
            f'label_replace({rate(names.PROMPT_TOKENS)}, "phase", "prefill", "", "")\n'
            "or\n"
            f'label_replace({rate(names.GENERATION_TOKENS)}, "phase", "decode", "", "")',
        ),
        # Live KV bytes as the agent counts them (the engine's KV groups), over the window.
        _record(kv_live, f"max by ({by_rank}) (avg_over_time({series(names.KV_LIVE_BYTES, sel)}[{config.rate_window}]))"),
        # Bytes the engine's steps read per second (weights a step touches and live KV, as the agent's MBU).
        _record(stream, rate(names.STREAMED_BYTES)),
        # Peak bandwidth of the GPUs one model copy spans: per-GPU peak x tensor-parallel size.
        _record(
            peak_bw,
            f"{ranks}\n"
            f"* on ({on_target}) group_left {const(names.GPU_PEAK_BANDWIDTH, on_target)}\n"
            f"* on ({on_model}) group_left {tp}",
        ),
        _record(mbu, f"{stream}\n/ on ({by_rank}) {peak_bw}"),
        # FLOP/s by phase, as the agent's MFU counts them.
        _record(flops, rate(names.FLOPS, labels(keep(config, *rank_phase)))),
        _record(
            peak_flops,
            f"{ranks}\n"
            f"* on ({on_target}) group_left {const(names.GPU_PEAK_FLOPS, on_target)}\n"
            f"* on ({on_model}) group_left {tp}",
        ),
        _record(mfu, f"{flops}\n/ on ({by_rank}) group_left {peak_flops}"),
        # Fleet level: numerators and denominators summed separately, then divided. Over every replica of
        # the model on purpose, but within one service scope (cluster, namespace: fleet_labels): prod and
        # staging are two fleets, never one sum.
        _record(fleet_tokens_record(config), f"sum by ({fleet_by(config, 'model', 'phase')}) ({tokens})"),
        # Each side only over the ranks that have both: a rank whose agent missed a scrape has no instant
        # peak for that evaluation while rate() still has its counter, and its bytes over the others'
        # peaks would read up to twice the fleet's MBU.
        _record(
            f"model:rooflight_mbu:ratio_rate{w}",
            f"sum by ({fleet_by(config, 'model')}) ({stream} and on ({by_rank}) {peak_bw})\n"
            f"/ on ({fleet_by(config, 'model')})\n"
            f"sum by ({fleet_by(config, 'model')}) ({peak_bw} and on ({by_rank}) {stream})",
        ),
        _record(
            f"model_phase:rooflight_mfu:ratio_rate{w}",
            f"sum by ({fleet_by(config, 'model', 'phase')}) ({flops} and on ({by_rank}) {peak_flops})\n"
            f"/ on ({fleet_by(config, 'model')}) group_left\n"
            f"sum by ({fleet_by(config, 'model')}) ({peak_flops} and on ({by_rank}) {flops})",
        ),
    ]


def mbu_record(config: RulesConfig) -> str:
    """The per-rank MBU series the low-MBU alert reads."""
    return record_name(rank_labels(config), "rooflight_mbu", f"ratio_rate{window_suffix(config.rate_window)}")


def tokens_record(config: RulesConfig) -> str:
    """The per-rank tokens/s by phase, from the agent's counters (what the capacity rules divide by)."""
    return record_name((*rank_labels(config), "phase"), "rooflight_tokens", f"rate{window_suffix(config.rate_window)}")


def fleet_tokens_record(config: RulesConfig) -> str:
    """The same summed by model and phase over the whole fleet."""
    return record_name(("model", "phase"), "rooflight_tokens", f"rate{window_suffix(config.rate_window)}")
