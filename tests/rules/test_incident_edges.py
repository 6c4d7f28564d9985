"""Edges of the shipped alerts that the incident catalogue (tests/rules/incidents.py) does not cross: each
case is two replicas' series replayed through rules/rooflight.rules.yaml with promtool, as the catalogue's
are, and at each check exactly the listed alerts fire. Each case is one nothing else
in the suite guards: the expected pages come from the rules' documented meaning, worked by hand in
the case's comment, not from running the rules."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from incidents import (A, B, SAMPLES, Check, Incident, absent_until, agent, canary, change, client, engine, fires, flat,
                       fleet, gpu, quiet, rank, rising, starts, stops, without, _idle)
from test_incidents import promtool_test

STALLED = ("RooflightEngineStalled", "critical", A, "")
TTFT = "vllm:time_to_first_token_seconds"


def counter(*spans: tuple[int, float]) -> str:
    """A counter from 0 rising `per_minute` until each span's minute (then the next span's rate), flat after
    the last span's minute: counter((20, 100), (40, 70), (90, 100))."""
    values, value, minute = [0.0], 0.0, 0
    for until, per_minute in spans:
        for minute in range(minute + 1, until + 1):
            value += per_minute
            values.append(value)
        minute = until
    values += [value] * (SAMPLES - len(values))
    return " ".join(str(int(v)) for v in values)


def every_third_minute() -> str:
    """A counter that counts one at every third minute: 20 an hour."""
    return " ".join(str(m // 3) for m in range(SAMPLES))


def other_route(pod: str, status: str) -> str:
    """The proxy's counter for requests that are not inference (route other: /v1/models, /health)."""
    return agent(pod, "rooflight_client_requests_total", target=pod, route="other", stream="false", status=status,
                 finish_reason="none", tenant="")


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
                          rank(A, "rooflight_requests_running"): change(0, 28, 1),
                          canary(A, "failed"): starts(2, 29)}),
             (Check("29m"), Check("31m", fires(STALLED)))),
    # -- GPU health: each alert means a state held or an event inside its window (10m), not a sample ever seen.
    # One minute at 90 C (a fan hiccup): GPUHot wants >= 85 C throughout the 10m window (min_over_time).
    Incident("A minute hot", "llm-b's GPU reads 90 C for the one minute at 30m.",
             fleet(llm_b={gpu(B, "rooflight_gpu_temperature_celsius"): f"{flat(62, 30)} 90 {flat(62, SAMPLES - 31)}"}),
             quiet("30m", "35m")),
    # XID 79 at 10m: the alert is the counter's increase over the 10m window, so it pages at 11m and is
    # resolved once 10m has passed without another (at 30m the window 20m-30m holds none).
    Incident("An XID long ago", "llm-a's GPU reports XID 79 at 10m and nothing after.",
             fleet(llm_a={gpu(A, "rooflight_gpu_xid_errors_total"): change(0, 10, 1),
                          gpu(A, "rooflight_gpu_xid_last_code"): absent_until(10, flat(79, SAMPLES - 10))}),
             (Check("9m"), Check("11m", fires(("RooflightGPUHardwareXid", "critical", A, ""))), Check("30m"))),
    # Two uncorrectable ECC errors at 30m: paged at once (for 0m), resolved 10m later.
    Incident("Uncorrectable ECC errors", "llm-b's GPU counts 2 double-bit ECC errors at 30m.",
             fleet(llm_b={gpu(B, "rooflight_gpu_ecc_uncorrected_errors_total"): change(0, 30, 2)}),
             (Check("29m"), Check("31m", fires(("RooflightGPUUncorrectableECC", "critical", B, ""))), Check("45m"))),
    # Clock event reasons 20 = sync boost (16) + SW power cap (4): neither is a slowdown bit (8, 32, 64, 128),
    # so floor(20 / bit) % 2 is 0 for each (20/8 = 2.5 -> 2 -> even) and the GPU is not throttled.
    Incident("Sync boost at the power cap", "llm-a's GPU runs in a sync-boost group at its power cap.",
             fleet(llm_a={gpu(A, "rooflight_gpu_clock_event_reasons"): flat(20)}), quiet("30m", "60m")),
    # The engines' ITL histograms dropped by relabelling (TTFT kept): the ITL burn alerts are blind, so
    # RooflightSLOHistogramMissing warns for both pods once its 15m `for` has passed.
    Incident("ITL histograms missing", "Prometheus keeps the engines' TTFT histograms but not their ITL ones.",
             without(fleet(), "vllm:inter_token_latency_seconds"),
             (Check("10m"), Check("20m", fires(("RooflightSLOHistogramMissing", "warning", A, ""),
                                               ("RooflightSLOHistogramMissing", "warning", B, ""))))),
    # -- availability and latency burn rates (SRE rows: 1h/5m x14.4 for 2m, 6h/30m x6 for 15m, critical).
    # From 20m the engine behind llm-a's proxy cuts 30 of 100 streams a minute mid-way (status 200, finish
    # upstream_error): 30% of requests failed, past 14.4 x 0.1% in both 1h and 5m windows by ~21m -> the
    # 1h row pages at ~23m, as the catalogue's 502 incident does with the same numbers.
    Incident("Upstream cuts streams", "From 20m llm-a's upstream drops 30 of 100 streams a minute after the 200.",
             fleet(llm_a={client(A, "200", "stop"): rising(70), client(A, "200", "upstream_error"): starts(30, 20)}),
             (Check("20m"), Check("30m", fires(("RooflightClientErrorBudgetBurn", "critical", "", "1h"))))),
    # 1 in 100 requests a minute answered 502 and marked upstream_error from the start: 1% failed, counted
    # once. Under the 1h row's 14.4 x 0.1% = 1.44%, over the 6h row's 6 x 0.1% = 0.6%; but the replay's
    # Prometheus holds 90 minutes, and the 6h row judges the budget spent so far (rules/burn.py): 1% over 89
    # of 360 minutes is 0.25% < 0.6%: quiet here; it pages once 216 minutes are spent (rules/tests/slow_burn_test.yaml).
    Incident("A 1% trickle of 502s", "llm-a's upstream answers 1 of 100 requests a minute 502, cut.",
             fleet(llm_a={client(A, "200", "stop"): rising(99), client(A, "502", "upstream_error"): rising(1)}),
             quiet("10m", "20m", "89m")),
    # /v1/models failing 503 (route other) while every chat request succeeds: no inference request failed,
    # nothing burns.
    Incident("Non-inference route failing", "llm-a answers /v1/models 503, 50 a minute; chat is fine.",
             fleet(llm_a={client(A, "200", "stop"): rising(100), other_route(A, "503"): rising(50)}),
             quiet("20m", "60m")),
    # A client storm, 30 of 100 requests a minute answered 502 from 20m to 40m, then healthy. The 1h row paged
    # during it (as "Upstream cuts streams" shows). At 46m the 1h window still reads 600 / 4600 = 13% (past
    # 1.44%), but the 5m window 41m-46m has no failure: the 1h row is over. The 6h row judges the budget spent
    # so far (rules/burn.py): 13% over the 46 of its 360 minutes the series lived is 1.7%, past 6 x 0.1%, and
    # its 30m window still holds the storm: 600 failures are 14% of the 4,320 a 30-day budget allows at 100
    # requests a minute, more than the 5% the 6h page means; it has paged since ~45m (pending from ~30m, its
    # `for` 15m), the page on-call already has for this model (one Alertmanager group).
    Incident("Client storm that ended", "llm-a's upstream fails 30% with 502 from 20m to 40m, then recovers.",
             fleet(llm_a={client(A, "200", "stop"): counter((20, 100), (40, 70), (90, 100)),
                          client(A, "502", "none"): counter((20, 0), (40, 30))}),
             (Check("30m", fires(("RooflightClientErrorBudgetBurn", "critical", "", "1h"))),
              Check("46m", fires(("RooflightClientErrorBudgetBurn", "critical", "", "6h"))))),
    # The engine's abort storm of the catalogue (300 aborts and 600 finished a minute on each replica), from
    # 20m to 40m only. At 46m: 1h window 12,000 / 67,200 = 18% (past 14.4 x 1%), its 5m window clean -> the
    # 1h row is over. With six hours of history the 6h window would read 12,000 / 388,800 = 3%, under 6 x 1%:
    # no page; the replay's 46 minutes read 18%, over 46 of 360 minutes 2.3% of the budget the 6h page means
    # (rules/burn.py: the budget spent so far), under 6 x 1%, so nothing pages either way.
    Incident("Abort storm that ended", "Both replicas abort 300 requests a minute from 20m to 40m.",
             fleet(llm_a={engine(A, "vllm:request_success_total", finished_reason="abort"): counter((20, 0), (40, 300))},
                   llm_b={engine(B, "vllm:request_success_total", finished_reason="abort"): counter((20, 0), (40, 300))}),
             quiet("46m")),
    # A quiet model on one replica, every request aborted, 1 a minute: the 1h window holds 20 requests from
    # 20m, 100% failed: past 14.4%, confirmed by the 5m window (100%): the 1h row pages at ~22m, before the 6h
    # row's 15m `for`. The 20-request floor is the long window's: 5 requests in 5m are not too few to confirm.
    Incident("Every request of a trickle aborted", "llm-a finishes 1 request a minute, each one aborted.",
             fleet(llm_a={**_idle(A), engine(A, "vllm:request_success_total", finished_reason="abort"): rising(1)},
                   llm_b=_idle(B)),
             (Check("15m"), Check("25m", fires(("RooflightRequestErrorBudgetBurn", "critical", "", "1h"))))),
    # The same trickle, each request's first token later than 2.5 s: the TTFT SLO burns as the abort one did.
    Incident("Every request of a trickle slow", "llm-a serves 1 request a minute, each first token past 2.5 s.",
             fleet(llm_a={**_idle(A), engine(A, f"{TTFT}_count"): rising(1),
                          engine(A, f"{TTFT}_bucket", le="2.5"): flat(0)},
                   llm_b=_idle(B)),
             (Check("15m"), Check("25m", fires(("RooflightTTFTBudgetBurn", "critical", "", "1h"))))),
    # The floor's edge: a model that finishes exactly 20 requests an hour (one every 3 minutes), each aborted.
    # Sampled each minute, the 1h window [t - 1h, t] has a sample at both ends from 60m: increase = 20 exactly,
    # "at least 20" holds; the 5m window always holds one of them (ratio 1). Pending at 60m, paged at 62m
    # (the 6h row's 15m `for` ends at 75m). At 50m the hour holds 16: quiet.
    Incident("Exactly 20 requests an hour, all aborted", "llm-a finishes one request every 3 minutes, aborted.",
             fleet(llm_a={**_idle(A), engine(A, "vllm:request_success_total", finished_reason="abort"):
                          every_third_minute()}, llm_b=_idle(B)),
             (Check("50m"), Check("63m", fires(("RooflightRequestErrorBudgetBurn", "critical", "", "1h"))))),
    Incident("Exactly 20 requests an hour, all slow", "llm-a serves one request every 3 minutes, each past 2.5 s.",
             fleet(llm_a={**_idle(A), engine(A, f"{TTFT}_count"): every_third_minute(),
                          engine(A, f"{TTFT}_bucket", le="2.5"): flat(0)}, llm_b=_idle(B)),
             (Check("50m"), Check("63m", fires(("RooflightTTFTBudgetBurn", "critical", "", "1h"))))),
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


@pytest.mark.prometheus
def test_a_healthy_engine_with_no_failure_series_yet_reads_0_errors_not_nothing(tmp_path: Path) -> None:
    # Both replicas finish 600 requests a minute by length and vLLM has never written an abort or error
    # series: the engine's error ratio is 0 / 20 requests/s = 0 in every burn window, a value a panel shows
    # (an empty record is a blank panel and a healthy service that looks unmonitored).
    healthy = without(fleet(), "vllm:request_success_total") | {
        engine(pod, "vllm:request_success_total", finished_reason="length"): rising(600) for pod in (A, B)}
    test = promtool_test(Incident("No failure series", "", healthy, quiet("30m")))
    checks = test["tests"][0]["promql_expr_test"]
    for window in ("5m", "1h"):
        record = f"model_name:rooflight_request_errors:ratio_rate{window}"
        checks.append({"expr": f"count({record} == 0)", "eval_time": "30m", "exp_samples": [{"labels": "{}", "value": 1}]})
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed")
    path = tmp_path / "zero_test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    run = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, f"{run.stdout}{run.stderr}"
