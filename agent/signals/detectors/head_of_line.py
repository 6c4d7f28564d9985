"""Head-of-line blocking: a long prompt prefilled whole stalls every in-flight decode.

The worst ITL since the previous sample (the ITL histogram's highest bucket that gained observations)
inflates to at least `hol_inflation` x its own recent median (the median of that worst over the longest
window) while prefill work is in the batch: where the engine says how many tokens each step ran (vLLM's
iteration_tokens_total), the largest step of the last 2 s grew to at least `hol_step_inflation` x the usual
largest step (of the recent seconds that ran a prefill, the value 80% of them stay at or under), which is
what a long prompt run whole is; elsewhere, computed prompt tokens per step over the short window at least
`hol_min_prefill_tokens_per_step`. Without the step, any stall of a busy host (a starved API server, a noisy
neighbour) while short prompts keep arriving counts, and on a shared CPU host those stalls dwarf a
prefill's (docs/physics.md, section Head-of-line blocking). One long prompt run whole stalls every decode
for one step; at the agent's 1 s resolution that step is visible, where its few observations vanish below
p99 in a 10 s or 1 m window. The derive step (signals/policy.py) holds the flag up `hol_hold_seconds` after
the stall so a 15-30 s Prometheus scrape sees it. Not while the engine preempts (short-window rate above
`hol_max_preemptions_per_second`): a preempted sequence's next token comes seconds later and its recompute
is prefill, so the tail inflates at the KV wall too; that is the capacity-capped verdict's to name. An
unknown preemption rate does not rule head-of-line out. Where the client-side proxy relays the target's
streams, the worst and its median are the exact per-token gaps it saw (ITL_FROM_PROXY) instead of the
engine's bucket edges (ITL_FROM_ENGINE); the verdict says which (`itl_source`).
"""

from __future__ import annotations

from typing import Any

from rooflight.agent.signals.detectors.base import (
    ABOVE_ONE, ITL_FROM_ENGINE, ITL_SOURCES, NONNEG, RATIO_SLACK, Choice, Detector, DetectorInputs, GaugeAlert, Knob,
    Panel, Series, Value, Verdict, all_of, at_least, over_median,
)

ITL_INFLATION = "rooflight_itl_tail_inflation"  # the dashboards draw it beside the flag


def itl_inflation(itl_worst_recent: float | None, itl_worst_baseline: float | None) -> float | None:
    """Worst ITL now over its own recent median; None when either is unknown or the median is not positive."""
    return over_median(itl_worst_recent, itl_worst_baseline)


def head_of_line(inputs: DetectorInputs, t: Any) -> Verdict:
    """The ITL tail inflated against its median while prefill work shared the batch, in a span whose
    largest step (where the engine tells it) grew far past the usual largest step."""
    factor = itl_inflation(inputs.itl_worst_recent, inputs.itl_worst_baseline)
    preemptions = inputs.preemptions_per_second_short
    return all_of(
        at_least(factor, t.hol_inflation * (1.0 - RATIO_SLACK)),
        at_least(inputs.itl_worst_recent, t.hol_min_itl_seconds),
        _prefill_in_the_batch(inputs, t),
        True if preemptions is None else preemptions <= t.hol_max_preemptions_per_second,
    )


def _prefill_in_the_batch(inputs: DetectorInputs, t: Any) -> Verdict:
    """Where the engine tells its steps' sizes: a recent step at least `hol_step_inflation` x the usual
    largest step (None while the usual one is unknown). That is the prefill the stall needs, where an
    average over 10 s is not: one 1,700-token prompt among 50-token ones read 0.8-0.9 prompt tokens a step
    on a real vLLM. Elsewhere: computed prompt tokens per step over the short window."""
    recent, baseline = inputs.step_tokens_largest_recent, inputs.step_tokens_largest_baseline
    if recent is None and baseline is None:
        return at_least(inputs.prefill_tokens_per_step_short, t.hol_min_prefill_tokens_per_step)
    return at_least(over_median(recent, baseline), t.hol_step_inflation * (1.0 - RATIO_SLACK))


DETECTOR = Detector(
    key="head_of_line",
    judge=head_of_line,
    order=10,
    title="Head-of-line blocking",
    sentence="A long prompt prefilled whole stalls every in-flight decode: the worst ITL inflated against its "
             "recent median while prompts shared the batch.",
    flag=Series("rooflight_head_of_line_blocking", "1 while the ITL tail inflates against its recent median with "
                                                   "prefill work in the batch."),
    alert="RooflightHeadOfLineBlocking",
    rule=GaugeAlert("Prefill work is stalling the decode batch (head-of-line blocking).", "max_over_time",
                    ITL_INFLATION, "overview", min_fraction=0.25, for_="5m", flag="hol"),
    knobs=(
        Knob("hol_inflation", 3.0, ABOVE_ONE, "worst-ITL / its recent median at which stutter counts as blocking. A "
             "long prompt run whole stretches one step ~43x (260 ms against a 6 ms baseline); chunked prefill brings "
             "that to ~4x."),
        Knob("hol_step_inflation", 3.0, ABOVE_ONE, "the largest recent step / the usual largest step (tokens a step "
             "ran, where the engine tells them) at which the stall counts as a prefill's. vLLM's step buckets are "
             "powers of two, so 3 asks for a step two buckets above the usual largest one (4x)."),
        Knob("hol_min_prefill_tokens_per_step", 1.0, NONNEG, "computed prompt tokens per engine step (short-window "
             "average) that count as prefill work in the batch. One 8,000-token prompt over 10 s of 6 ms steps "
             "averages ~5."),
        Knob("hol_min_itl_seconds", 0.0, NONNEG, "an absolute floor under which inflation is not reported as "
             "blocking (0 = no floor); set it to your ITL SLO threshold to ignore harmless jitter."),
        Knob("hol_max_preemptions_per_second", 0.0, NONNEG, "preemption rate above which an inflated tail is the KV "
             "wall's doing."),
        Knob("hol_hold_seconds", 30.0, NONNEG, "how long the flag stays up after the last stall (a stall lasts one "
             "step)."),
    ),
    values=(Value("itl_inflation", Series(
        ITL_INFLATION, "The worst ITL since the agent's previous sample / its own recent median (of that worst, "
        "over the longest window); the worst is the upper bound of the highest ITL bucket that gained "
        "observations, or the exact worst gap between tokens where the proxy judged. A factor, 1 on steady traffic "
        "and unbounded above (not a _ratio in 0..1).", ""),
        lambda i: itl_inflation(i.itl_worst_recent, i.itl_worst_baseline)),),
    choice=Choice("itl_source", Series(
        "rooflight_head_of_line_source", "Which ITL judged head-of-line (one series per source, 1 for the one that "
        "did): proxy = the exact gaps between tokens the client-side proxy relayed (rooflight run --proxy-listen, a "
        "target with one series, once 30 s of them are known), engine = the engine's ITL histogram buckets.",
        labels=("source",)), ITL_SOURCES, ITL_FROM_ENGINE, lambda i: i.itl_source),
    panel=Panel("overview", "Head-of-line detector", "", "A"),
    nvtx="head-of-line stall",
)
