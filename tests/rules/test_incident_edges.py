"""Edges of the shipped alerts that the incident catalogue (tests/rules/incidents.py) does not cross: each
case is two replicas' series replayed through rules/rooflight.rules.yaml with promtool, as the catalogue's
are, and at each check exactly the listed alerts fire. Each case is one a mutation audit of the rules
found unguarded (issue 30): the expected pages come from the rules' documented meaning, worked by hand in
the case's comment, not from running the rules."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from incidents import A, Check, Incident, change, fires, flat, fleet, quiet, rank, stops, without
from test_incidents import promtool_test

STALLED = ("RooflightEngineStalled", "critical", A, "")


def _flat_tokens(pod: str, at: int) -> dict[str, str]:
    """No prompt or generated token from minute `at` on."""
    return {rank(pod, "rooflight_generation_tokens_total"): stops(2000 * 60, at),
            rank(pod, "rooflight_prompt_tokens_total"): stops(6000 * 60, at)}


EDGES: tuple[Incident, ...] = (
    # One 1M-token prompt in chunked prefill from 20m: one request running, no token counted until its
    # prefill ends, but the engine steps 145 times a minute: progress, not a hang (the steps' `unless`).
    Incident("Long chunked prefill", "llm-a runs one huge prompt from 20m: steps advance, no token yet.",
             fleet(llm_a={**_flat_tokens(A, 20), rank(A, "rooflight_requests_running"): change(16, 20, 1)}),
             quiet("25m", "30m")),
    # A prefill-only pod of an engine with no step counter: it counts prompt tokens and never generates.
    # Prompt tokens are progress, so it must not read as stalled.
    Incident("Prefill pod without a step counter", "llm-a computes prompts only and exports no step counter.",
             without(fleet(llm_a={rank(A, "rooflight_generation_tokens_total"): flat(7e5)}),
                     "rooflight_engine_steps_total"),
             quiet("25m", "60m")),
    # An idle pod (nothing running, counters flat) gets one request at 28m that hangs. The alert asks for
    # work held the whole 2m window (min_over_time): at 29m the window still reaches back to 27m's 0, so
    # nothing is pending yet; from 30m (Prometheus 2's closed range: 28m, 29m, 30m all 1) it is pending and
    # fires one `for` (1m) later, 31m. An alert on work held at any moment would be pending from 28m and
    # page at 29m, on a request one minute old.
    Incident("Hang of a request that just arrived", "llm-a idle, one request arrives at 28m and hangs.",
             fleet(llm_a={rank(A, "rooflight_engine_steps_total"): flat(5e5),
                          rank(A, "rooflight_generation_tokens_total"): flat(9e5),
                          rank(A, "rooflight_prompt_tokens_total"): flat(7e5),
                          rank(A, "rooflight_requests_running"): change(0, 28, 1)}),
             (Check("29m"), Check("31m", fires(STALLED)))),
)


@pytest.mark.prometheus
@pytest.mark.parametrize("edge", EDGES, ids=[e.name for e in EDGES])
def test_the_edge_pages_exactly_as_the_rules_mean(edge: Incident, tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed")
    path = tmp_path / "edge_test.yaml"
    path.write_text(yaml.safe_dump(promtool_test(edge), sort_keys=False))
    run = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, f"{edge.name}: {edge.what}\n{run.stdout}{run.stderr}"
