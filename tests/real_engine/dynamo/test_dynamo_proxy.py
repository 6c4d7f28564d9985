"""`rooflight proxy` in front of the real Dynamo frontend (the aggregated deployment's load goes through
it): the client-side figures it measures against the frontend's own and the client's.

Where each side's clock stops: the frontend times TTFT and ITL at its HTTP edge as it sends each chunk,
the proxy when the bytes reach it, the client when it has parsed them; so per request the intervals
nest (client around proxy around frontend) and the means are ordered. Tokens come from the streams'
usage (the proxy) and the frontend's counters, and must be equal.
"""

from __future__ import annotations

import pytest

from dynamo_runs import PROXY_SLO
from scrape import bucket_delta, total

pytestmark = pytest.mark.real_engine

CLIENT = "rooflight_client_"
SLACK_S = 0.002  # three processes time nested intervals; their readings' order, per mean
FE_TTFT, FE_ITL = "dynamo_frontend_time_to_first_token_seconds", "dynamo_frontend_inter_token_latency_seconds"


def _inc(after, before, name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


def _mean(after, before, name: str) -> float:
    return _inc(after, before, name + "_sum") / _inc(after, before, name + "_count")


def test_proxy_tokens_and_requests_equal_the_frontend_and_the_client(agg_run):
    r, load = agg_run, agg_run.load
    px = (r.proxy_after, r.proxy_before)
    assert _inc(*px, CLIENT + "output_tokens_total") == _inc(r.after["frontend"], r.before["frontend"],
                                                              "dynamo_frontend_output_tokens_total") == load.completion_tokens
    assert _inc(*px, CLIENT + "prompt_tokens_total") == _inc(r.after["frontend"], r.before["frontend"],
                                                              "dynamo_frontend_input_sequence_tokens_sum") == load.prompt_tokens
    assert _inc(*px, CLIENT + "requests_total") == len(load.ok) == len(load.results)
    assert _inc(r.after["frontend"], r.before["frontend"], FE_TTFT + "_count") == len(load.ok)
    assert total(r.proxy_after, CLIENT + "upstream_errors_total") == 0
    assert total(r.proxy_after, CLIENT + "accounting_errors_total") == 0


def test_ttft_means_nest_client_around_proxy_around_frontend(agg_run):
    r = agg_run
    frontend = _mean(r.after["frontend"], r.before["frontend"], FE_TTFT)
    proxy = _mean(r.proxy_after, r.proxy_before, CLIENT + "time_to_first_token_seconds")
    ttfts = r.load.ttfts()
    client = sum(ttfts) / len(ttfts)
    assert client + SLACK_S >= proxy >= frontend - SLACK_S, (client, proxy, frontend)


def test_itl_mean_agrees_with_the_frontend(agg_run):
    """Per token gaps, summed over the same requests: the proxy sees the frontend's chunks a hop later,
    so the mean gap is the same within the hop's jitter (chunks of one token each here)."""
    r = agg_run
    frontend = _mean(r.after["frontend"], r.before["frontend"], FE_ITL)
    proxy = _mean(r.proxy_after, r.proxy_before, CLIENT + "inter_token_latency_seconds")
    assert frontend > 0.001  # the mocker's timing model: milliseconds a decode step
    assert proxy == pytest.approx(frontend, rel=0.15, abs=0.001), (proxy, frontend)


def test_goodput_judges_every_request_and_no_fewer_good_than_the_client(agg_run):
    """Judged = every streamed request that finished; the proxy's intervals are inside the client's, so
    every request the client saw meet the SLO met it at the proxy too; and the frontend's TTFT buckets
    bound how many can have met the TTFT target."""
    r, load = agg_run, agg_run.load
    judged = _inc(r.proxy_after, r.proxy_before, CLIENT + "slo_requests_total", slo=PROXY_SLO)
    good = _inc(r.proxy_after, r.proxy_before, CLIENT + "slo_good_requests_total", slo=PROXY_SLO)
    assert judged == len(load.ok)
    client_good = sum(1 for x in load.ok if x.ttft_s is not None and x.ttft_s <= 0.5
                      and (x.e2e_s - x.ttft_s) / max(1, x.completion_tokens - 1) <= 0.05)
    assert client_good <= good <= judged
    fe_under = dict(bucket_delta(r.after["frontend"], r.before["frontend"], FE_TTFT))[1.0]  # TTFT <= 1 s
    assert good <= fe_under, (good, fe_under)
