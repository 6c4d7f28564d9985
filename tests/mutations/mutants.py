"""The fixed mutations the fast suite must kill: each a bug a user would be hurt by, written as one exact
edit of one file, with the tests that must fail on it (tests/mutations/test_mutants.py applies each to a
copy of the checkout and runs them). A mutant whose text no longer appears fails the check: when the code
it names changes, the mutant is rewritten against the new code, never dropped to make the run pass.

How the list was chosen, and the audits behind it: docs/testing.md, "Mutation audits"."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    key: str
    path: str  # the file, from the checkout's root
    old: str  # exact text, found once in the file
    new: str
    tests: tuple[str, ...]  # pytest node ids or files; "promtool:<file>" runs `promtool test rules` on it
    hurts: str  # what a user would see

    @property
    def regenerates_rules(self) -> bool:
        """Whether the rules file must be written again from the mutated generator before the tests run."""
        return self.path.startswith("rules/") and self.path.endswith(".py")


CHECKPOINTS = "tests/agent/roofline/test_checkpoints.py"
STEP = "tests/agent/roofline/test_step_layout.py"
STALLED = "tests/agent/signals/test_engine_stalled.py"
EDGES = "tests/agent/signals/test_derive_edges.py"
SHAPE = "tests/agent/proxy/test_proxy_shape.py"

MUTANTS: tuple[Mutant, ...] = (
    # -- the physics: the step model and what reads it ---------------------------------------------------------
    Mutant("ridge-inverted", "agent/roofline/physics.py",
           "    return peak_flops / peak_bandwidth\n", "    return peak_bandwidth / peak_flops\n",
           (f"{CHECKPOINTS}::test_dense_16_bit_crossover_is_the_ridge",),
           "every ridge, intensity verdict and compute-bound call upside down"),
    Mutant("attention-without-its-causal-mask", "agent/roofline/physics.py",
           "        return n * (n + 1) / 2\n", "        return n * n\n",
           (f"{CHECKPOINTS}::test_deepseek_v3_2048_token_prefill_is_memory_bound",),
           "prefill attention FLOPs doubled: MFU twice what it is"),
    Mutant("sliding-window-unbounded", "agent/roofline/physics.py",
           "sum(n * min(context_tokens, w) for w, n in windowed_layers)", "sum(n * context_tokens for w, n in windowed_layers)",
           (f"{CHECKPOINTS}::test_mistral_7b_v01_at_32k_keeps_only_its_4096_token_window",),
           "KV bytes of sliding-window models (Gemma, Mistral, gpt-oss) grow past their window"),
    Mutant("kv-not-summed-over-tp", "agent/roofline/step.py",
           "return m.kv_bytes_per_layer_token * self.tp * m.kv_bytes_per_token_per_gpu(self.tp)",
           "return m.kv_bytes_per_layer_token * m.kv_bytes_per_token_per_gpu(self.tp)",
           (f"{STEP}::test_a_layer_tokens_kv_bytes_summed_over_the_copys_gpus_at_tp",),
           "at TP > 1, live KV bytes and decode MBU 1/tp of what they are"),
    Mutant("prefill-overlaps-decode", "agent/roofline/step.py",
           "return max(memory, self.decode_flops / roofs.flops) + prefill",
           "return max(memory, self.decode_flops / roofs.flops, prefill)",
           (f"{STEP}::test_a_step_that_decodes_runs_its_prefill_after_the_longer_of_its_reads_and_its_decode",),
           "mixed steps priced as if prefill were free beside the decode reads: capacity overstated"),
    Mutant("expert-ranks-ignore-tp", "agent/roofline/step.py",
           "return max(1.0, self.ep / self.tp)", "return max(1.0, float(self.ep))",
           (f"{EDGES}::test_expert_ranks_are_the_model_copies_that_share_one_set_of_experts",),
           "EP over TP copies: each rank's expert share read tp times too small"),
    Mutant("weights-per-gpu-whole-copy", "agent/roofline/step.py",
           "return (self.model.weight_bytes - experts + experts / self.expert_ranks) / self.tp",
           "return self.model.weight_bytes - experts + experts / self.expert_ranks",
           (f"{CHECKPOINTS}::test_meta_405b_fp8_id_maps_to_its_fp8_checkpoint_and_fits_on_8_h100",),
           "plan says a model does not fit where it does (each GPU charged the whole copy)"),
    Mutant("lm-head-per-prompt-token", "agent/roofline/step.py",
           "return prefill.tokens * per_token + prefill.logits * FLOPS_PER_PARAM * m.lm_head_params",
           "return prefill.tokens * (per_token + FLOPS_PER_PARAM * m.lm_head_params)",
           (f"{CHECKPOINTS}::test_deepseek_v3_2048_token_prefill_is_memory_bound",),
           "prefill FLOPs count the LM head for every prompt token: MFU overstated"),
    Mutant("untied-embedding-table-streamed", "agent/roofline/models.py",
           "dense = self.weight_bytes - table + min(rows, table)", "dense = self.weight_bytes",
           (f"{CHECKPOINTS}::test_mistral_7b_v01_at_32k_keeps_only_its_4096_token_window",),
           "decode MBU counts the whole input-embedding table each step"),
    Mutant("moe-every-expert-streamed", "agent/roofline/models.py",
           "return dense - experts + experts / ranks * self._touched(tokens * ranks)",
           "return dense - experts + experts / ranks",
           ("tests/agent/roofline/test_plan.py::test_moe_streams_only_touched_experts",),
           "MoE decode MBU reads every expert each step: 5-10x too high at small batch"),
    Mutant("plan-decode-at-the-whole-compute-peak", "agent/roofline/plan.py",
           "return decode_seconds_per_token(layout, roofs, batch, layer_tokens, spec)",
           "return decode_seconds_per_token(layout, Roofs(roofs.flops / prefill_mfu, roofs.bandwidth, roofs.link), "
           "batch, layer_tokens, spec)",
           ("tests/agent/roofline/test_plan.py::test_a_compute_bound_decode_pool_runs_at_the_prefill_mfu_share_of_the_compute_peak",),
           "plan overstates a compute-bound decode pool 2x"),
    # -- the derive step, detectors and the proxy's accounting ----------------------------------------------
    Mutant("counter-reset-as-drop", "agent/signals/windows.py",
           "step = raw - prev_raw if raw >= prev_raw else raw", "step = raw - prev_raw",
           ("tests/agent/signals/test_windows.py",),
           "an engine restart reads as a negative throughput"),
    Mutant("stall-held-running-only", "agent/signals/derive.py",
           "held = [p.gauges[RUNNING] + p.gauges.get(WAITING, 0.0) for p", "held = [p.gauges[RUNNING] for p",
           (f"{STALLED}::test_a_hang_with_everything_queued_reads_stalled",),
           "an engine hung with everything queued is never flagged"),
    Mutant("stall-held-max", "agent/signals/derive.py",
           '"held_min_stall": min(held) if held', '"held_min_stall": max(held) if held',
           (f"{STALLED}::test_held_work_that_dipped_to_zero_in_the_window_is_no_stall",),
           "a false stall where held work dipped to 0 in the window"),
    Mutant("hit-ratio-over-one", "agent/signals/derive.py",
           "return ratio if ratio is not None and 0.0 <= ratio <= 1.0 else None",
           "return ratio if ratio is not None and 0.0 <= ratio else None",
           (f"{EDGES}::test_a_counter_hit_ratio_over_one_is_no_ratio_and_takes_no_prompt_tokens_away",),
           "a hit ratio over 1 exported, prefill tokens negative"),
    Mutant("falling-usage-count", "agent/proxy/tracker.py",
           "return max(0, count - (before or 0))", "return count - (before or 0)",
           (f"{SHAPE}::test_a_falling_running_count_is_no_token_and_no_gap",),
           "a falling usage count makes a spurious gap and negative tokens"),
    Mutant("large-chunk-one-output", "agent/proxy/sse.py",
           "outputs = max(1, len(_FINISH_KEY.findall(data))) if streamed", "outputs = 1 if streamed",
           (f"{SHAPE}::test_a_large_chunk_of_several_choices_counts_an_output_per_choice",),
           "chunks over 256 KiB with several choices counted as one"),
    Mutant("hybrid-groups-threshold", "agent/roofline/models.py",
           "return most if most < fewest * 1.25 else fewest", "return most if most < fewest * 1.5 else fewest",
           ("tests/agent/roofline/test_served_models.py::test_hybrid_groups_take_the_most_only_within_a_quarter",),
           "live KV bytes off for models whose full/sliding layer counts differ 1.25-1.5x"),
    Mutant("304-framed-by-length", "agent/proxy/relay.py",
           "status < 200 or status in (204, 304)", "status < 200 or status in (204,)",
           ("tests/agent/proxy/test_proxy_attack.py::test_a_304_ends_at_its_head_whatever_its_content_length_says",),
           "a 304 with a Content-Length holds the client's connection until it times out"),
    Mutant("shape-without-its-other-text-check", "agent/proxy/sse.py",
           'if interpret_data(before + text + b"x" + after) != info:', "if False:",
           (f"{SHAPE}::test_a_shape_is_refused_where_another_text_in_its_slot_would_read_otherwise",),
           "a stream whose string in the text's slot is read for itself (a finish reason) counted by a wrong shape"),
    Mutant("outbox-drop-counts-one", "agent/proxy/workers.py",
           "stats.accounting_errors += len(records)", "stats.accounting_errors += 1",
           ("tests/agent/proxy/test_proxy_workers.py::test_a_full_outbox_counts_every_record_of_the_batch_it_drops",),
           "unaccounted requests under-reported when a worker's queue is full"),
    Mutant("parent-errors-dropped", "agent/proxy/workers.py",
           'stats.accounting_errors = (self._own_errors + retired["accounting_errors"]',
           'stats.accounting_errors = (retired["accounting_errors"]',
           ("tests/agent/proxy/test_proxy_workers.py::test_records_the_parent_fails_to_observe_are_on_metrics_beside_the_workers",),
           "records the parent failed to observe with --workers vanish from /metrics"),
    # -- the alert rules: each edit of rules/config.py regenerates the rules, then promtool tests them -------------
    Mutant("burn-6h-row-late", "rules/config.py",
           'BurnWindow("6h", "30m", 6.0, "15m", "critical")', 'BurnWindow("6h", "30m", 6.0, "30m", "critical")',
           ("promtool:rules/tests/burn_6h_test.yaml",),
           "a moderate burn pages 15 minutes later"),
    Mutant("burn-3d-row-blunt", "rules/config.py",
           'BurnWindow("3d", "6h", 1.0, "3h", "warning")', 'BurnWindow("3d", "6h", 3.0, "3h", "warning")',
           ("promtool:rules/tests/burn_3d_test.yaml",),
           "a slow burn that spends the month's budget opens no ticket"),
    Mutant("low-mbu-blunt", "rules/config.py",
           "low_mbu_threshold: float = 0.3", "low_mbu_threshold: float = 0.05",
           ("promtool:rules/tests/health_test.yaml",),
           "a decode streaming a tenth of its bandwidth for half an hour raises nothing"),
    Mutant("stall-pages-late", "rules/config.py",
           'engine_stalled_for: str = "1m"', 'engine_stalled_for: str = "10m"',
           ("promtool:rules/tests/stall_test.yaml",),
           "a hung engine whose /metrics still answers pages ten minutes late"),
    Mutant("throttle-share-blunt", "rules/config.py",
           "gpu_throttle_share: float = 0.25", "gpu_throttle_share: float = 0.75",
           ("promtool:rules/tests/gpu_health_test.yaml",),
           "a GPU throttled a third of the time never alerts"),
    Mutant("agent-absent-late", "rules/config.py",
           'agent_absent_for: str = "15m"', 'agent_absent_for: str = "1h"',
           ("promtool:rules/tests/meta_test.yaml",),
           "no agent scraped anywhere, and no alert for an hour"),
)
