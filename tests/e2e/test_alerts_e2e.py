"""Our rules on a real Prometheus, scraping `rooflight demo` as a user runs it: the right alerts, only them.

Two demos run at once (head-of-line and kv-wall), each as its own `rooflight demo` process; one
Prometheus (Debian's, via tests/promstack.py, scrape and evaluation every 1 s) scrapes both agents and
both simulated engines (the SLO rules read the engines' vllm:* histograms) and evaluates the rules
rendered from rooflight.rules.config with short windows and `for` durations (SHORT below). Through the HTTP API
the test checks, over the whole run (range queries on ALERTS, not a lucky poll):

- RooflightHeadOfLineBlocking goes pending then firing for the head-of-line agent's target, and never
  for the kv-wall target; RooflightBatchCapacityCapped the other way round;
- RooflightEngineDown, RooflightGPUDown, RooflightBatchAdmissionBound and RooflightSLOBucketMissing
  never go pending for either, and RooflightLowDecodeMBU not once the rate window is full (see
  LATE_ONLY);
- the recording rules (rate window 1m) agree with the agent's own 1m-window rooflight_mbu_ratio,
  rooflight_mfu_ratio and rooflight_tokens_per_second, both averaged over the same 20 s, within
  TOLERANCE.

SHORT is the production config with only durations changed; the first (fast) test proves it by
rendering both and comparing them with every duration masked.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from rooflight.rules.config import RulesConfig
from rooflight.rules.promql import record_name
from rooflight.rules.recording import rank_labels
from rooflight.rules.render import render
import promstack
from demo_procs import start_demo, stop_process
from support import ROOT

# The production config with every duration shortened so a two-minute run can exercise each alert.
# Burn-rate rows are the SRE workbook's divided by 60 (1h -> 1m); detector windows 10m -> 20s; the
# recording rules' rate window is the agent's 1m window so the two can be compared directly.
_PROD = RulesConfig()
SHORT = replace(
    _PROD,
    burn_windows=(
        replace(_PROD.burn_windows[0], long="1m", short="5s", for_="2s"),
        replace(_PROD.burn_windows[1], long="6m", short="30s", for_="15s"),
        replace(_PROD.burn_windows[2], long="24m", short="2m", for_="1m"),
        replace(_PROD.burn_windows[3], long="72m", short="6m", for_="3m"),
    ),
    bucket_guard_for="15s",
    rate_window="1m",
    detector_alerts=tuple((key, replace(alert, window="20s", for_="5s")) for key, alert in _PROD.detector_alerts),
    low_mbu_for="1m",
    engine_down_for="10s",
    gpu_down_for="10s",
)

# Recording rule vs agent, same nominal 1m window, computed from different samples: the agent's value
# comes from its own 1 s samples up to ~2 s before Prometheus scraped it, and rate() extrapolates 1 s
# scrapes to the window's edges, so the two windows are offset by up to ~3 s of 60. kv-wall's prefill
# arrives in lumps (a preempted sequence's recompute is thousands of tokens at once), and one instant
# measured 8% apart. So both sides are averaged over SMOOTH of evaluations (after the 1m window is full
# on both), which divides that noise. The rules rate the agent's own work counters
# (rooflight_model_streamed_bytes_total, rooflight_model_flops_total), so MBU and MFU disagree no more
# than tokens/s does: over three runs MBU -1.4% to +0.1%, MFU -2.6% to +0.3%, tokens/s -2.1% to +0.9%.
# The rules that rebuilt them from constants read MBU +1.3% and +5.7%, prefill MFU +10.4% and +12.9%
# (`pytest -s tests/e2e/test_alerts_e2e.py` prints each; docs/physics.md, Live ratios, The recording
# rules). 5%: twice the noise, under the old error.
TOLERANCE = 0.05
SMOOTH = "20s"

SCENARIOS = ("head-of-line", "kv-wall")
EXPECTED = {"head-of-line": "RooflightHeadOfLineBlocking", "kv-wall": "RooflightBatchCapacityCapped"}
NEVER = ("RooflightEngineDown", "RooflightGPUDown", "RooflightBatchAdmissionBound", "RooflightSLOBucketMissing")
# rate() divides a partial window's increase by the whole range, so for one rate window after scraping
# starts the recorded MBU ramps up from 0 and the low-MBU condition holds (pending, never firing: its
# `for` is at least the rate window). Checked only once the window is full.
LATE_ONLY = ("RooflightLowDecodeMBU",)
RATE_WINDOW_SECONDS = 60.0
MIN_SCRAPED_SECONDS = 90.0  # a full 1m window on both sides, then SMOOTH and a margin
DEADLINE_SECONDS = 170.0

# one unit (5m) or several (5h30m: a burn row's history offset, rules/burn.py)
_DURATION = re.compile(r"(?<![0-9.])(?:[0-9]+(?:ms|s|m|h|d|w|y))+\b")
# a recorded rate times its window in seconds: the count over the window (rules/availability.py's guards)
_RATE_TIMES_WINDOW = re.compile(r"(:rate<D>) \* [0-9]+\b")


def _mask_durations(doc: Any) -> Any:
    """The parsed rules with every Prometheus duration (and a rule name's duration suffix) masked."""
    if isinstance(doc, dict):
        return {_mask_durations(k): _mask_durations(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_mask_durations(v) for v in doc]
    return _RATE_TIMES_WINDOW.sub(r"\1 * <D>", _DURATION.sub("<D>", doc)) if isinstance(doc, str) else doc


def test_short_rules_are_the_production_rules_with_only_durations_changed() -> None:
    for fmt in ("yaml", "prometheusrule"):
        prod, short = render(_PROD, fmt), render(SHORT, fmt)
        assert prod != short
        assert _mask_durations(yaml.safe_load(prod)) == _mask_durations(yaml.safe_load(short))
        assert len(_DURATION.findall(prod)) == len(_DURATION.findall(short)) > 20
    # and the checked-in production file is the default render, untouched by this test
    assert (ROOT / "rules" / "rooflight.rules.yaml").read_text() == render(_PROD)


# -- the real run ------------------------------------------------------------------------------------

def _alerts_seen(prom: promstack.PromStack, seconds: float) -> set[tuple[str, str, str]]:
    """(alertname, alertstate, target) of every ALERTS series present at any evaluation in the last `seconds`."""
    rows = prom.query(f"last_over_time(ALERTS[{int(seconds) + 1}s])")
    return {(r["metric"]["alertname"], r["metric"]["alertstate"], r["metric"].get("target", "")) for r in rows}


def _by_target(rows: list[dict[str, Any]], *keys: str) -> dict[tuple[str, ...], float]:
    return {tuple(r["metric"].get(k, "") for k in ("target", *keys)): float(r["value"][1]) for r in rows}


def _compare(prom: promstack.PromStack, at: float, agent_expr: str, rule: str, *keys: str) -> list[str]:
    """Each (target, keys) series of the agent's metric against the recording rule, both averaged over
    SMOOTH; the mismatches."""
    agent = _by_target(prom.query(f"avg_over_time({agent_expr}[{SMOOTH}])", at), *keys)
    recorded = _by_target(prom.query(f"avg_over_time({rule}[{SMOOTH}])", at), *keys)
    if not agent or set(agent) != set(recorded):
        return [f"{agent_expr} vs {rule}: series {sorted(agent)} != {sorted(recorded)}"]
    bad = []
    for key, value in sorted(agent.items()):
        got = recorded[key]
        ok = value > 0 and abs(got - value) <= TOLERANCE * value
        print(f"{rule} {key}: recorded {got:.6g}, agent {value:.6g}, diff {got / value - 1 if value else 0:+.2%}")
        if not ok:
            bad.append(f"{key}: {rule} = {got:.6g}, agent {agent_expr} = {value:.6g}")
    return bad


needs_prometheus = pytest.mark.skipif(not promstack.available(), reason="Debian's prometheus is not installed")


@pytest.mark.prometheus
@needs_prometheus
def test_alerts_and_recording_rules_on_the_demo(tmp_path: Path) -> None:
    rules = tmp_path / "rooflight-short.rules.yaml"
    rules.write_text(render(SHORT))
    ports = {s: (promstack.free_port(), promstack.free_port()) for s in SCENARIOS}
    target = {s: f"127.0.0.1:{ports[s][1]}" for s in SCENARIOS}  # the agent names a target host:port
    demos = {s: start_demo(s, f"127.0.0.1:{ports[s][0]}", f"127.0.0.1:{ports[s][1]}") for s in SCENARIOS}
    try:
        scrape = [f"127.0.0.1:{p}" for s in SCENARIOS for p in ports[s]]
        with promstack.PromStack(scrape, [rules]) as prom:
            begin = time.monotonic()
            prom.wait_for('count(rooflight_mbu_ratio{window="10s"}) == 2', timeout=60)
            scraping_since = time.monotonic()
            want = {(EXPECTED[s], "firing", target[s]) for s in SCENARIOS}
            seen: set[tuple[str, str, str]] = set()
            while time.monotonic() - begin < DEADLINE_SECONDS:
                for s, proc in demos.items():
                    assert proc.poll() is None, f"rooflight demo {s} exited: {stop_process(proc)[-2000:]}"
                seen = _alerts_seen(prom, time.monotonic() - begin)
                if want <= seen and time.monotonic() - scraping_since >= MIN_SCRAPED_SECONDS:
                    break
                time.sleep(1.0)
            ran = time.monotonic() - begin
            seen = _alerts_seen(prom, ran)
            print(f"after {ran:.0f} s: {sorted(seen)}")

            problems: list[str] = []
            for s in SCENARIOS:
                other = next(o for o in SCENARIOS if o != s)
                for state in ("pending", "firing"):
                    if (EXPECTED[s], state, target[s]) not in seen:
                        problems.append(f"{EXPECTED[s]} never {state} on the {s} demo")
                wrong = sorted(a for a in seen if a[0] == EXPECTED[other] and a[2] == target[s])
                if wrong:
                    problems.append(f"{EXPECTED[other]} on the {s} demo: {wrong}")
            never = sorted(a for a in seen if a[0] in NEVER)
            late = _alerts_seen(prom, time.monotonic() - scraping_since - RATE_WINDOW_SECONDS)
            never += sorted(a for a in late if a[0] in LATE_ONLY)
            if never:
                problems.append(f"alerts that must not go pending: {never}")

            # the SLO rules evaluate over the engines' histograms (a missing `le` would leave them empty)
            for slo in ("ttft", "itl"):
                if not prom.query(f"model_name:rooflight_{slo}_slo_errors:ratio_rate1m"):
                    problems.append(f"the {slo} SLO error-ratio rule is empty")

            at = time.time()
            rank = rank_labels(SHORT)
            problems += _compare(prom, at, 'rooflight_mbu_ratio{window="1m"}',
                                 record_name(rank, "rooflight_mbu", "ratio_rate1m"))
            problems += _compare(prom, at, 'rooflight_mfu_ratio{window="1m"}',
                                 record_name((*rank, "phase"), "rooflight_mfu", "ratio_rate1m"), "phase")
            problems += _compare(prom, at, 'rooflight_tokens_per_second{window="1m"}',
                                 record_name((*rank, "phase"), "rooflight_tokens", "rate1m"), "phase")
            assert not problems, "\n".join(problems)
    finally:
        for proc in demos.values():
            stop_process(proc)
    assert all(proc.returncode is not None for proc in demos.values())
