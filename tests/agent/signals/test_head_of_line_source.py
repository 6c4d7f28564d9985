"""Head-of-line judged by the proxy's exact gaps between tokens, and by the engine's buckets without them.

A scripted vLLM over real HTTP, sampled by hand once a second on a FakeClock: 100 decode steps and 500
computed prompt tokens a second (5 per step: prefill in the batch), every ITL in vLLM's (0.01, 0.025]
bucket, every step in the (8, 16] tokens bucket. At the stall, one second's ITLs land in (0.025, 0.05]:
the buckets read 0.05 / 0.025 = 2x, under the threshold of 3, as vLLM's edges blur a 4 ms -> 60 ms stall
(docs/physics.md, section Head-of-line blocking). The proxy's gaps for the same seconds: 4-6 ms, then one
of 60 ms (10x). A long prompt run whole puts one step in the (1024, 2048] bucket, 128x the usual largest
step; a host that stalls (a starved API server, a noisy neighbour) stretches the gaps with no such step,
and that is not head-of-line.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import AsyncIterator

import pytest

from rooflight.agent.signals.detectors import ITL_FROM_ENGINE, ITL_FROM_PROXY, Verdicts
from rooflight.agent.signals.token_gaps import ClientGaps
from support import Rig, exported, scripted_agent

STEPS_PER_S, PROMPT_PER_S = 100, 500
NORMAL_GAPS = (0.004, 0.005, 0.006, 0.004)  # a second's gaps as the proxy sees them: the worst is 6 ms
STALL_GAP = 0.060
BASELINE_SECONDS = 40  # the baselines need 30 s of values (three 10 s windows) before they judge


class ScriptedVllm:
    """vLLM's counters after `seconds` of steady decoding, `stalled` of whose seconds had their ITLs at 2x."""

    def __init__(self, ranks: tuple[str, ...] = ("0",)) -> None:
        self.ranks = ranks
        self.seconds = 0
        self.stalled = 0
        self.stalled_far = 0  # seconds whose ITLs landed in (0.075, 0.1]: 4x the usual bucket
        self.long_steps = 0  # steps that ran a long prompt whole: (1024, 2048] tokens
        self.wave_steps = 0  # steps that admitted eight short prompts at once: (256, 512] tokens
        self.prompt_tokens = 0

    def page(self) -> str:
        lines = []
        for name, kind in (("num_requests_running", "gauge"), ("num_requests_waiting", "gauge"),
                           ("kv_cache_usage_perc", "gauge"), ("prompt_tokens_total", "counter"),
                           ("generation_tokens_total", "counter"), ("num_preemptions_total", "counter"),
                           ("iteration_tokens_total", "histogram"), ("inter_token_latency_seconds", "histogram")):
            lines.append(f"# TYPE vllm:{name} {kind}")
            for rank in self.ranks:
                lines += self._series(name, f'engine="{rank}",model_name="m"')
        return "\n".join(lines) + "\n"

    def _series(self, name: str, lab: str) -> list[str]:
        steps = STEPS_PER_S * self.seconds
        values = {"num_requests_running": 8, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.3,
                  "prompt_tokens_total": self.prompt_tokens, "generation_tokens_total": 8 * steps,
                  "num_preemptions_total": 0}
        if name in values:
            return [f"vllm:{name}{{{lab}}} {values[name]}"]
        if name == "iteration_tokens_total":
            usual = steps - self.long_steps - self.wave_steps
            cumulative = (("8", 0), ("16", usual), ("512", usual + self.wave_steps), ("1024", usual + self.wave_steps),
                          ("2048", steps), ("+Inf", steps))
            return [f'vllm:{name}_bucket{{{lab},le="{le}"}} {n}' for le, n in cumulative] + [
                f"vllm:{name}_count{{{lab}}} {steps}", f"vllm:{name}_sum{{{lab}}} 0"]
        normal = 8 * STEPS_PER_S * (self.seconds - self.stalled - self.stalled_far)
        near = 8 * steps - 8 * STEPS_PER_S * self.stalled_far
        cumulative = (("0.01", 0), ("0.025", normal), ("0.05", near), ("0.075", near), ("0.1", 8 * steps),
                      ("+Inf", 8 * steps))
        return [f'vllm:{name}_bucket{{{lab},le="{le}"}} {n}' for le, n in cumulative] + [
            f"vllm:{name}_count{{{lab}}} {8 * steps}", f"vllm:{name}_sum{{{lab}}} 0"]


class Run:
    """A scripted agent (support.scripted_agent) against a ScriptedVllm, with or without the proxy's gaps."""

    def __init__(self, rig: Rig, vllm: ScriptedVllm, gaps: ClientGaps | None) -> None:
        self.rig, self.vllm, self.gaps = rig, vllm, gaps

    async def second(self, *, stall: bool = False, client_gaps: tuple[float, ...] = NORMAL_GAPS,
                     long_prompt: bool = True, far: bool = False, prompts: int = PROMPT_PER_S,
                     wave: bool = False) -> tuple[Verdicts, ...]:
        """One second of decoding (the proxy's gaps arrive through it), then the agent's sample. A stall is a
        long prompt's (one step of it in the second) unless `long_prompt` is False: the host's; `far` puts
        its ITLs in the engine's 0.1 s bucket (4x) instead of 0.05 s (2x). `prompts` computed prompt tokens
        arrive in the second; `wave` puts one step of (256, 512] tokens in it (eight prompts admitted at once)."""
        start = self.rig.clock.now
        self.vllm.seconds += 1
        self.vllm.stalled += stall and not far
        self.vllm.stalled_far += stall and far
        self.vllm.long_steps += stall and long_prompt
        self.vllm.wave_steps += wave
        self.vllm.prompt_tokens += prompts
        if self.gaps is not None:
            gaps = client_gaps + ((STALL_GAP,) if stall else ())
            for i, gap in enumerate(gaps):
                self.gaps.add(start + (i + 1) / (len(gaps) + 1), gap)
        await self.rig.sample(self.vllm.page())
        (target,) = self.rig.agent.snapshot.targets
        return tuple(s.verdicts for s in target.series)


async def _a_wave_stall_is_usual_and_a_long_prompt_is_not(run: Run, prompts_between: int) -> None:
    """Against a usual largest step of 512: a host stall in a wave's second (its ITLs at 4x) is not
    head-of-line; a long prompt's step (2048, 4x the usual) two seconds later is."""
    (host,) = await run.second(stall=True, far=True, long_prompt=False, prompts=400, wave=True)
    assert host.itl_inflation == pytest.approx(0.1 / 0.025)
    assert host.head_of_line is False
    for _ in range(2):
        await run.second(prompts=prompts_between)
    (prompt,) = await run.second(stall=True, far=True, prompts=1700)
    assert prompt.head_of_line is True


@pytest.fixture
async def run_with() -> AsyncIterator:
    async with AsyncExitStack() as stack:
        async def make(*, proxy: bool, ranks: tuple[str, ...] = ("0",)) -> Run:
            vllm = ScriptedVllm(ranks)
            rig = await stack.enter_async_context(
                scripted_agent(vllm.page(), 1.0, windows="10s,1m,5m", batch_max=None))
            gaps = ClientGaps() if proxy else None
            if gaps is not None:
                rig.agent.use_client_gaps(rig.agent.config.targets[0].name, gaps)
            await rig.agent.sample_engines_once()
            return Run(rig, vllm, gaps)

        yield make


async def test_the_proxy_catches_a_stall_the_engine_buckets_blur(run_with) -> None:
    run = await run_with(proxy=True)
    for _ in range(BASELINE_SECONDS):
        (steady,) = await run.second()
    assert steady.itl_source == ITL_FROM_PROXY
    assert steady.head_of_line is False
    assert steady.itl_inflation == pytest.approx(1.0)
    (stalled,) = await run.second(stall=True)
    assert stalled.itl_source == ITL_FROM_PROXY
    assert stalled.itl_inflation == pytest.approx(STALL_GAP / max(NORMAL_GAPS))
    assert stalled.head_of_line is True


async def test_without_the_proxy_the_same_stall_reads_2x_and_is_not_flagged(run_with) -> None:
    run = await run_with(proxy=False)
    for _ in range(BASELINE_SECONDS):
        (steady,) = await run.second()
    assert steady.itl_source == ITL_FROM_ENGINE and steady.head_of_line is False
    (stalled,) = await run.second(stall=True)
    assert stalled.itl_source == ITL_FROM_ENGINE
    assert stalled.itl_inflation == pytest.approx(0.05 / 0.025)
    assert stalled.head_of_line is False


async def test_the_engine_judges_until_the_proxy_has_a_baseline_and_while_it_sees_no_tokens(run_with) -> None:
    run = await run_with(proxy=True)
    for _ in range(5):
        (early,) = await run.second()
    assert early.itl_source == ITL_FROM_ENGINE  # the proxy's baseline needs 30 s
    for _ in range(BASELINE_SECONDS):
        await run.second()
    (overlap,) = await run.second(client_gaps=())  # no stream through the proxy this second, but the
    assert overlap.itl_source == ITL_FROM_PROXY  # span is 1.5 intervals: the previous second's end counts
    (quiet,) = await run.second(client_gaps=())
    assert quiet.itl_source == ITL_FROM_ENGINE
    (back,) = await run.second()
    assert back.itl_source == ITL_FROM_PROXY


async def test_a_target_with_several_ranks_is_judged_by_the_engine(run_with) -> None:
    """The proxy cannot tell which rank a stream ran on: its gaps judge no rank."""
    run = await run_with(proxy=True, ranks=("0", "1"))
    for _ in range(BASELINE_SECONDS):
        await run.second()
    verdicts = await run.second(stall=True)
    assert [v.itl_source for v in verdicts] == [ITL_FROM_ENGINE, ITL_FROM_ENGINE]
    assert [v.head_of_line for v in verdicts] == [False, False]


async def test_the_source_is_exported_one_series_per_source(run_with) -> None:
    run = await run_with(proxy=True)
    for _ in range(BASELINE_SECONDS):
        await run.second()
    await run.second(stall=True)
    metrics = exported(run.rig.agent)
    sources = {dict(labels)["source"]: value for (name, labels), value in metrics.items()
               if name == "rooflight_head_of_line_source" and ("model", "m") in labels and ("rank", "0") in labels}
    assert sources == {"engine": 0.0, "proxy": 1.0}
    assert [v for (name, _), v in metrics.items() if name == "rooflight_head_of_line_blocking"] == [1.0]


async def test_streams_that_arrive_in_bursts_leave_the_judging_to_the_engine(run_with) -> None:
    """An API server behind its engine writes many tokens per read: gaps of 0, a median of 0, no ratio."""
    run = await run_with(proxy=True)
    for _ in range(BASELINE_SECONDS):
        (burst,) = await run.second(client_gaps=(0.0, 0.0, 0.0))
    assert burst.itl_source == ITL_FROM_ENGINE
    assert burst.itl_inflation == pytest.approx(1.0)


async def test_a_stalled_host_without_a_larger_step_is_not_head_of_line_through_the_proxy(run_with) -> None:
    """The proxy sees a 60 ms gap (10x) but no step ran more than usual: the host stalled, not a prefill."""
    run = await run_with(proxy=True)
    for _ in range(BASELINE_SECONDS):
        await run.second()
    (host,) = await run.second(stall=True, long_prompt=False)
    assert host.itl_source == ITL_FROM_PROXY
    assert host.itl_inflation == pytest.approx(STALL_GAP / max(NORMAL_GAPS))
    assert host.head_of_line is False
    for _ in range(2):  # out of the span of 1.5 intervals
        await run.second()
    (prompt,) = await run.second(stall=True)
    assert prompt.head_of_line is True


async def test_the_engine_buckets_flag_a_long_prompt_stall_and_not_a_stalled_host(run_with) -> None:
    run = await run_with(proxy=False)
    for _ in range(BASELINE_SECONDS):
        await run.second()
    (host,) = await run.second(stall=True, far=True, long_prompt=False)
    assert host.itl_source == ITL_FROM_ENGINE
    assert host.itl_inflation == pytest.approx(0.1 / 0.025)
    assert host.head_of_line is False
    for _ in range(2):
        await run.second()
    (prompt,) = await run.second(stall=True, far=True)
    assert prompt.itl_inflation == pytest.approx(0.1 / 0.025)
    assert prompt.head_of_line is True


async def test_the_usual_largest_step_is_that_of_the_seconds_that_ran_a_prefill(run_with) -> None:
    """Streams that finish together: a second admits a wave of eight prompts (a step of up to 512 tokens),
    the next decodes only (no prompt, steps of 16). Against every second's largest step a wave would read
    32x; the decode-only seconds join no baseline, so the usual largest step is the wave's, and a host stall
    in a wave's second is not head-of-line; a long prompt's step (2048, 4x) still is."""
    run = await run_with(proxy=False)
    for i in range(BASELINE_SECONDS):
        await run.second(prompts=400 if i % 2 else 0, wave=bool(i % 2))
    await run.second(prompts=0)
    await _a_wave_stall_is_usual_and_a_long_prompt_is_not(run, prompts_between=0)


async def test_a_step_one_sample_before_the_stall_still_explains_it(run_with) -> None:
    """The proxy times a gap when its token arrives, the engine's counters show the step when a scrape reads
    them: on a busy host a long prompt's step can land a sample before the stall the proxy saw."""
    run = await run_with(proxy=True)
    for _ in range(BASELINE_SECONDS):
        await run.second()
    run.vllm.long_steps += 1  # the long prompt's step, read in this second's page
    await run.second()
    (late,) = await run.second(stall=True, long_prompt=False)  # its stall, read by the proxy a second later
    assert late.itl_source == ITL_FROM_PROXY
    assert late.head_of_line is True


async def test_waves_in_a_third_of_the_prefill_seconds_are_usual(run_with) -> None:
    """On a shared host the streams drift apart and waves of eight prompts (a step of up
    to 512 tokens) come in a third of the seconds that ran a prefill, single prompts (steps of 16) in the
    rest. The usual largest step is the one 80% of those seconds stay at or under, 512: a host stall in a
    wave's second reads 1x, not head-of-line (at 60% it would be 16, and the wave 32x); a long prompt's
    step (2048, 4x) still is."""
    run = await run_with(proxy=False)
    for i in range(BASELINE_SECONDS + 5):
        await run.second(prompts=400 if i % 3 == 0 else 50, wave=i % 3 == 0)
    await _a_wave_stall_is_usual_and_a_long_prompt_is_not(run, prompts_between=50)
