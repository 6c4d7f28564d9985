"""The engine-stalled detector through the agent, over real HTTP: a vLLM page holding 16 running requests
whose counters stop moving reads rooflight_engine_stalled 1 once the 30 s stall window is covered, and 0 as
soon as a token moves again; the status page names it."""

from __future__ import annotations

import re

from rooflight.agent.serve import status
from support import sample_text, scripted_agent

PAGE = sample_text("vllm-cpu-load-c16.prom")  # 16 running, 0 waiting
STALLED = "rooflight_engine_stalled"


def _with_generated(page: str, tokens: float) -> str:
    return re.sub(r"^(vllm:generation_tokens_total\{[^}]*\}) \S+$", rf"\g<1> {tokens}", page, flags=re.M)


def _stalled(metrics: dict) -> float | None:
    values = [v for (name, _), v in metrics.items() if name == STALLED]
    assert len(values) <= 1
    return values[0] if values else None


async def test_a_page_whose_counters_stop_with_work_held_reads_stalled_after_the_window() -> None:
    async with scripted_agent(PAGE, interval=0.5, windows="5s,60s") as rig:
        seen = [_stalled(await rig.sample(PAGE)) for _ in range(50)]  # 25 s: the 30 s window not yet covered
        assert 1.0 not in seen
        seen = [_stalled(await rig.sample(PAGE)) for _ in range(20)]  # 35 s of the same page
        assert seen[-1] == 1.0
        detector = next(d for d in status.detectors(rig.agent.snapshot.targets[0].series[0].verdicts)
                        if d["key"] == "engine_stalled")
        assert detector["state"] == "active" and "RooflightEngineStalled" in detector["alert"]
        # one token moves: it is slow, not hung
        assert _stalled(await rig.sample(_with_generated(PAGE, 8097.0))) == 0.0


async def test_an_engine_that_keeps_generating_is_never_stalled() -> None:
    async with scripted_agent(PAGE, interval=0.5, windows="5s,60s") as rig:
        tokens = 8096.0
        for _ in range(80):  # 40 s, one token a sample
            tokens += 1
            assert _stalled(await rig.sample(_with_generated(PAGE, tokens))) in (None, 0.0)


async def test_an_engine_that_counts_no_steps_is_never_judged_stalled() -> None:
    """Without a step counter (TensorRT-LLM counts tokens only when a request ends) flat counters with work held
    are long requests as much as a hang: the detector says nothing rather than a false 1."""
    no_steps = "\n".join(line for line in PAGE.splitlines() if "iteration_tokens" not in line) + "\n"
    async with scripted_agent(no_steps, interval=0.5, windows="5s,60s") as rig:
        for _ in range(80):  # 40 s of the same page: 16 running, nothing moves
            assert _stalled(await rig.sample(no_steps)) is None


def _holding(page: str, running: float, waiting: float) -> str:
    page = re.sub(r"^(vllm:num_requests_running\{[^}]*\}) \S+$", rf"\g<1> {running}", page, flags=re.M)
    return re.sub(r"^(vllm:num_requests_waiting\{[^}]*\}) \S+$", rf"\g<1> {waiting}", page, flags=re.M)


async def test_a_hang_with_everything_queued_reads_stalled() -> None:
    """0 running and 20 waiting, nothing moving for the whole window: held work is running + waiting, so a
    scheduler that admits nothing is as hung as one that steps nothing."""
    queued = _holding(PAGE, 0.0, 20.0)
    async with scripted_agent(queued, interval=0.5, windows="5s,60s") as rig:
        seen = [_stalled(await rig.sample(queued)) for _ in range(70)]  # 35 s of the same page
        assert seen[-1] == 1.0, seen[-5:]


async def test_held_work_that_dipped_to_zero_in_the_window_is_no_stall() -> None:
    """Flat counters with 16 held, but one sample 6 s ago read nothing held: an engine that emptied and
    took work again inside the window was not hung through it (the least held over the window is 0)."""
    empty = _holding(PAGE, 0.0, 0.0)
    async with scripted_agent(PAGE, interval=0.5, windows="5s,60s") as rig:
        pages = [PAGE] * 58 + [empty] + [PAGE] * 12  # 35.5 s: the empty one 6 s before the last
        seen = [_stalled(await rig.sample(page)) for page in pages]
        assert seen[-1] == 0.0, seen[-5:]
        for _ in range(60):  # 30 s more of the held page: the dip leaves the window, the hang is seen
            last = _stalled(await rig.sample(PAGE))
        assert last == 1.0
