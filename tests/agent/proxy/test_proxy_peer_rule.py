"""bench/proxy_peer.py's reading of `vllm bench serve --goodput` (vllm/benchmarks/serve.py, calculate_metrics),
at its edges, on hand-made per-request results: the comparison with the proxy is only as good as this.
The real-engine test checks it against the peer's own count on a real run."""

from __future__ import annotations

import itertools
import random
import time

import pytest

from bench.proxy_peer import Pair, PeerRun, ProxyFigures, Spec, least_cost_assignment, slo_label, slo_spelling
from rooflight.agent.proxy.slo import parse_slo


def run(*requests: dict) -> PeerRun:
    """The peer's saved detailed result: one entry per request in each list."""
    keys = ("ttfts", "latencies", "output_lens", "itls", "errors")
    result = {k: [r[k] for r in requests] for k in keys}
    result.update(completed=sum(1 for r in requests if not r["errors"]), request_goodput=0.0, duration=1.0)
    return PeerRun("t", result, 0.0)


def req(ttft: float = 0.125, gaps: tuple[float, ...] = (0.0078125, 0.0078125), out: int | None = None,
        error: str = "") -> dict:
    return {"ttfts": ttft, "latencies": ttft + sum(gaps), "output_lens": len(gaps) + 1 if out is None else out,
            "itls": list(gaps), "errors": error}


def test_a_value_equal_to_its_target_is_good_and_one_over_is_not() -> None:
    on = run(req(ttft=0.125, gaps=(0.0078125, 0.0078125)))  # binary fractions: exact TPOT 1/128 s
    assert on.good({"ttft": 0.125, "tpot": 0.0078125}) == 1
    assert on.good({"ttft": 0.125 - 2 ** -20}) == 0
    assert on.good({"tpot": 0.0078125 - 2 ** -20}) == 0
    assert on.good({"e2e": 0.140625}) == 1 and on.good({"e2e": 0.140625 - 2 ** -20}) == 0


def test_one_output_token_has_tpot_0_and_failed_requests_are_never_good() -> None:
    assert run(req(gaps=(), out=1)).good({"tpot": 1e-9, "itl": 1e-9}) == 1
    assert run(req(error="boom")).good({"ttft": 10.0}) == 0


def test_tpot_divides_by_the_output_tokens_not_the_chunks() -> None:
    """Two chunks of 5 tokens: TPOT = (latency - TTFT) / 4, the ITL list has one gap."""
    r = run(req(gaps=(0.0625,), out=5))
    assert r.good({"tpot": 0.015625}) == 1 and r.good({"tpot": 0.015625 - 2 ** -20}) == 0
    assert r.good({"itl": 0.0625}) == 1 and r.good({"itl": 0.0625 - 2 ** -20}) == 0  # the longest gap, as the proxy's


def test_the_proxy_is_given_the_peers_targets_as_the_same_floats() -> None:
    spec = Spec(model="m", tokenizer="t", goodput=("ttft:150", "tpot:9.4", "e2el:2000"), itl_ms=50)
    joint = spec.slos()["joint"]
    assert joint == {"ttft": 150 / 1000, "tpot": 9.4 / 1000, "e2e": 2000 / 1000}
    slo = parse_slo(slo_spelling(joint))
    assert dict(slo.targets) == joint  # the same float as the peer's ms / 1000: the edge is the same edge
    assert slo.name == slo_label(joint)  # the `slo` label the harness reads back
    assert spec.slos()["itl"] == {"itl": 0.05} and spec.slos()["tpot"] == {"tpot": 9.4 / 1000}


@pytest.mark.parametrize("targets", [{"ttft": 0.15}, {"tpot": 0.0094, "itl": 0.05}])
def test_labels_match_the_proxys_canonical_spelling(targets: dict[str, float]) -> None:
    assert parse_slo(slo_spelling(targets)).name == slo_label(targets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_the_least_cost_assignment_is_the_least_of_every_permutation(n: int) -> None:
    rng = random.Random(n)
    for _ in range(60):
        cost = [[rng.choice([rng.random(), 1e6]) for _ in range(n)] for _ in range(n)]
        column = least_cost_assignment(cost)
        assert sorted(column) == list(range(n))
        best = min(sum(cost[i][p[i]] for i in range(n)) for p in itertools.permutations(range(n)))
        assert sum(cost[i][column[i]] for i in range(n)) == pytest.approx(best)


def _pair(peer: list[tuple[float, float, float]], logged: list[tuple[float, float, float]]) -> Pair:
    """Peer requests (start, first token, last token) on the monotonic clock and the proxy's lines for them."""
    offset = time.time() - time.monotonic()
    result = {"start_times": [s for s, _, _ in peer], "ttfts": [f - s for s, f, _ in peer],
              "latencies": [e - s for s, _, e in peer], "output_lens": [4] * len(peer), "itls": [[]] * len(peer),
              "errors": [""] * len(peer), "completed": len(peer)}
    lines = [{"start": s + offset, "ttft": f - s, "last_token": e - s, "output_tokens": 4, "tpot": None,
              "itl_max": None} for s, f, e in logged]
    spec = Spec(model="m", tokenizer="t")
    return Pair(spec, PeerRun("d", result, 0.0), PeerRun("p", result, 0.0), None, "direct first", lines)  # type: ignore[arg-type]


def test_requests_that_reached_the_proxy_out_of_their_start_order_are_paired_by_their_tokens() -> None:
    # the peer started A, then B 0.05 ms later; B reached the proxy first, and B's tokens came first
    a, b = (10.0, 10.5, 11.0), (10.00005, 10.3, 10.8)
    pairs = _pair([a, b], [(10.002, 10.2998, 10.7998), (10.003, 10.4998, 10.9998)]).matched()
    # each 0.2 ms apart (paired in start order, 0.2 s: the other's), give or take two reads of the clocks' offset
    assert [(p.first_token - x.first_token, p.last_token - x.last_token) for p, x in pairs] \
        == [(pytest.approx(0.0002, abs=1e-4), pytest.approx(0.0002, abs=1e-4))] * 2


def test_a_line_no_request_could_have_made_leaves_nothing_paired() -> None:
    # the proxy's line starts after the peer already had its first token: not that request's
    assert _pair([(10.0, 10.5, 11.0)], [(10.6, 10.7, 10.9)]).matched() == []
    assert _pair([(10.0, 10.5, 11.0)], []).matched() == []


def test_the_peers_gaps_read_together_and_its_later_tokens_count_its_successful_requests_alone() -> None:
    peer = run(req(gaps=(0.004, 0.00005, 0.00009, 0.0001)),  # two gaps under 0.1 ms: chunks read at once
               req(gaps=(0.00001,) * 6, error="timeout"),  # a failed request counts in neither
               req(gaps=(), out=1))
    assert peer.read_together() == 2 / 4
    assert peer.later_tokens == 4
    assert run(req(gaps=(), out=1)).read_together() == 0.0  # no gap: nothing read together


def test_the_proxys_share_of_gaps_together_is_its_first_buckets_over_the_run() -> None:
    name = "rooflight_client_inter_token_latency_seconds"
    first, rest = frozenset({("le", "0.001")}), frozenset({("le", "0.002")})
    before = {(name + "_bucket", first): 10.0, (name + "_bucket", rest): 30.0, (name + "_count", frozenset()): 40.0}
    after = {(name + "_bucket", first): 25.0, (name + "_bucket", rest): 90.0, (name + "_count", frozenset()): 100.0}
    assert ProxyFigures(before, after).together() == 15 / 60
    assert ProxyFigures(after, after).together() == 0.0  # no gap over the run


def test_the_proxys_share_of_gaps_together_reads_its_edge_at_1_ms_whatever_its_buckets() -> None:
    name = "rooflight_client_inter_token_latency_seconds"
    edges = ("0.0005", "0.001", "0.002", "+Inf")
    before = {(name + "_bucket", frozenset({("le", le)})): 0.0 for le in edges} | {(name + "_count", frozenset()): 0.0}
    after = {(name + "_bucket", frozenset({("le", le)})): n for le, n in zip(edges, (5.0, 20.0, 70.0, 80.0))}
    after[(name + "_count", frozenset())] = 80.0
    assert ProxyFigures(before, after).together() == 20 / 80  # the 1 ms edge, not the first (0.5 ms)
    coarse = {(name + "_bucket", frozenset({("le", le)})): 1.0 for le in ("0.005", "+Inf")}
    with pytest.raises(ValueError, match="no edge at or under 0.001 s"):
        ProxyFigures(coarse, coarse).together()
