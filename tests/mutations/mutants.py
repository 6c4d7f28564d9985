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


STALLED = "tests/agent/signals/test_engine_stalled.py"
EDGES = "tests/agent/signals/test_derive_edges.py"
SHAPE = "tests/agent/proxy/test_proxy_shape.py"

MUTANTS: tuple[Mutant, ...] = (
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
)
