"""Goodput, windows, histograms, tenants and the exposition, on records with chosen times (a fake clock)."""

from __future__ import annotations

import math
import random
import re
from array import array

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rooflight.agent.errors import ConfigError
from rooflight.agent.proxy import catalog as c
from rooflight.agent.proxy.exposition import registry_for
from rooflight.agent.proxy.quantiles import ExactWindows, GapSketch, percentile
from rooflight.agent.proxy.slo import judged, meets, parse_slo, parse_slos
from rooflight.agent.proxy.stats import ClientStats, StatsConfig, histogram_edges
from rooflight.agent.proxy.tenants import TenantTop, tenant_key
from rooflight.agent.proxy.tracker import CLIENT_DISCONNECTED, COMPLETE, UPSTREAM_ERROR, RequestRecord
from rooflight.agent.sampling.clock import FakeClock

SLO = "ttft=0.5,tpot=0.05"


def rec(end: float, ttft: float | None = 0.1, gaps: tuple[float, ...] = (0.02,), tokens: int | None = None,
        status: int = 200, outcome: str = COMPLETE, stream: bool = True, tenant: str | None = None,
        finish: str = "stop", route: str = "chat") -> RequestRecord:
    """A stream whose e2e is TTFT + its gaps (so TPOT is the mean gap), finished at `end`."""
    e2e = (ttft or 0.0) + sum(gaps)
    return RequestRecord(route=route, tenant=tenant, start=end - e2e, end=end, status=status, outcome=outcome,
                         stream=stream, finish_reason=finish, ttft=ttft, itl=array("d", gaps),
                         prompt_tokens=5, output_tokens=(1 + len(gaps)) if tokens is None else tokens,
                         counted_by="usage")


def stats(clock: FakeClock, slos: tuple[str, ...] = (SLO,), **kw: object) -> ClientStats:
    return ClientStats(StatsConfig(target="up:8000", slos=parse_slos(list(slos)), **kw), started=clock.monotonic())


def values(snap, name: str) -> dict[tuple[str, ...], float]:
    return {labels: v for n, labels, v in (*snap.counters, *snap.gauges) if n == name}


# -- SLO parsing and the DistServe verdict ------------------------------------------------------------


def test_slo_spelling() -> None:
    slo = parse_slo(" TTFT=500ms, tpot=0.05 ")
    assert slo.name == "ttft=0.5,tpot=0.05" and slo.target("ttft") == 0.5 and slo.target("e2e") is None
    for bad in ("ttft", "ttft=abc", "p99=0.1", "ttft=0.5,ttft=1", "", "ttft=-1", "ttft=0", "itl=0.1,itl=0.2"):
        with pytest.raises(ConfigError):
            parse_slo(bad)
    with pytest.raises(ConfigError):
        parse_slos(["ttft=0.5", "ttft=500ms"])  # the same SLO twice
    joint = parse_slo("ttft=150ms,itl=50ms,tpot=9.4ms,e2e=2")
    assert joint.name == "ttft=0.15,itl=0.05,tpot=0.0094,e2e=2" and joint.target("itl") == 0.05
    with pytest.raises(ConfigError, match="itl"):
        parse_slo("p99=1")  # the message names every key


def test_the_itl_target_is_met_when_every_gap_is_within_it() -> None:
    """vLLM's bench serve has no ITL goodput key: a request meets `itl` when its longest gap between token
    chunks does (a stall any token saw misses it; TPOT is the mean and cannot show one)."""
    slo = parse_slo("itl=0.0625")
    assert meets(slo, rec(1, gaps=(0.0625, 0.0625, 0.0625)))  # on the target is within it
    assert not meets(slo, rec(1, gaps=(0.01, 0.0625 + 2 ** -20, 0.01)))  # one gap over: mean 0.03 would pass
    assert meets(parse_slo("tpot=0.0625"), rec(1, gaps=(0.01, 0.1, 0.01)))  # ... as TPOT (the mean) does
    assert meets(slo, rec(1, gaps=()))  # one token: no gap, like TPOT's "no TPOT" (0 in vLLM)
    assert not meets(slo, rec(1, ttft=None, gaps=(), tokens=0))  # no output at all
    assert not meets(parse_slo("ttft=0.5,itl=0.05"), rec(1, ttft=0.6, gaps=(0.01,)))  # joint: TTFT missed


def test_tpot_for_goodput_stops_at_the_last_token_as_vllm_bench_serve() -> None:
    """vLLM's bench serve: TPOT = (latency - TTFT) / (output tokens - 1), latency to the last chunk with
    choices; the usage chunk and [DONE] after it do not count. A slow tail after the last token is e2e's."""
    r = RequestRecord(route="completions", tenant=None, start=0.0, end=1.0, status=200, outcome=COMPLETE,
                      stream=True, finish_reason="length", ttft=0.25, itl=array("d", [0.125, 0.125]),
                      prompt_tokens=3, output_tokens=3, counted_by="usage", last_token=0.5)
    assert r.tpot == 0.125 and r.e2e == 1.0
    assert meets(parse_slo("ttft=0.25,tpot=0.125"), r) and not meets(parse_slo("e2e=0.5"), r)


def test_goodput_needs_both_targets_met() -> None:
    slo = parse_slo(SLO)
    assert meets(slo, rec(1, ttft=0.5, gaps=(0.05, 0.05)))  # on the targets is within them
    assert not meets(slo, rec(1, ttft=0.51, gaps=(0.01,)))  # TTFT missed
    assert not meets(slo, rec(1, ttft=0.1, gaps=(0.02, 0.1)))  # mean gap 0.06: TPOT missed
    assert meets(slo, rec(1, ttft=0.1, gaps=()))  # one token: no TPOT, meets it as the benchmark tools do
    assert not meets(slo, rec(1, ttft=None, gaps=(), tokens=0))  # no output at all
    assert not meets(slo, rec(1, finish=UPSTREAM_ERROR))


def test_an_aborted_stream_or_one_with_no_token_is_never_good() -> None:
    """Good means a finished, successful stream within every target: one the engine aborted (finish_reason
    abort) did not finish, however fast its tokens were; a stream with no token met no target, a TPOT-only
    SLO included (no TPOT is "met" only for a stream that has its one token)."""
    assert meets(parse_slo("tpot=0.05"), rec(1, ttft=0.1, gaps=(0.01, 0.01)))  # the same stream, finished: good
    assert not meets(parse_slo("tpot=0.05"), rec(1, ttft=0.1, gaps=(0.01, 0.01), finish="abort"))
    assert not meets(parse_slo("ttft=0.5,tpot=0.05,e2e=2"), rec(1, ttft=0.1, gaps=(0.01,), finish="abort"))
    assert meets(parse_slo("tpot=0.05"), rec(1, ttft=0.1, gaps=()))  # one token: no TPOT, met
    assert not meets(parse_slo("tpot=0.05"), rec(1, ttft=None, gaps=(), tokens=0))  # no token at all


@pytest.mark.parametrize("record, counted", [
    (rec(1), True), (rec(1, status=429), True), (rec(1, status=500), True), (rec(1, status=502, stream=False), True),
    (rec(1, status=400), False), (rec(1, outcome=CLIENT_DISCONNECTED), False), (rec(1, stream=False), False),
    (rec(1, route="other"), False), (rec(1, outcome=UPSTREAM_ERROR), True),
])
def test_which_requests_are_judged(record: RequestRecord, counted: bool) -> None:
    assert judged(record) is counted


def test_goodput_counters_and_ratios_are_exact() -> None:
    clock = FakeClock()
    s = stats(clock, slos=(SLO, "ttft=0.2"))
    t0 = clock.monotonic()
    records = [
        rec(t0 + 1, ttft=0.1, gaps=(0.02, 0.03)),  # good for both
        rec(t0 + 2, ttft=0.3, gaps=(0.02,)),  # good for SLO, misses ttft=0.2
        rec(t0 + 3, ttft=0.7, gaps=(0.02,)),  # misses TTFT
        rec(t0 + 4, ttft=0.1, gaps=(0.2, 0.1)),  # misses TPOT (0.15) only: still good for ttft=0.2
        rec(t0 + 5, ttft=0.1, gaps=()),  # one token
        rec(t0 + 6, status=429),  # judged, bad
        rec(t0 + 7, status=503, stream=False),  # judged, bad
        rec(t0 + 8, outcome=CLIENT_DISCONNECTED),  # not judged
        rec(t0 + 9, status=400),  # not judged
        rec(t0 + 9.5, stream=False),  # not judged: no TTFT without a stream
    ]
    for r in records:
        s.observe(r)
    clock.advance(10)
    snap = s.snapshot(clock.monotonic())
    judged_ = values(snap, c.SLO_REQUESTS)
    good = values(snap, c.SLO_GOOD)
    assert judged_ == {("up:8000", SLO, "none"): 7.0, ("up:8000", "ttft=0.2", "none"): 7.0}
    assert good == {("up:8000", SLO, "none"): 3.0, ("up:8000", "ttft=0.2", "none"): 3.0}
    ratio = values(snap, c.GOODPUT_RATIO)
    assert ratio[("up:8000", SLO, "1m")] == pytest.approx(3 / 7)
    rate = values(snap, c.GOODPUT_RATE)
    assert rate[("up:8000", SLO, "1m")] == pytest.approx(3 / 10)  # the proxy is 10 s old: 3 good in 10 s
    assert rate[("up:8000", SLO, "10s")] == pytest.approx(3 / 10)
    clock.advance(4.5)  # the 10 s window now starts after the fourth request
    snap = s.snapshot(clock.monotonic())
    assert values(snap, c.GOODPUT_RATIO)[("up:8000", SLO, "10s")] == pytest.approx(1 / 3)  # records 5, 6, 7
    assert values(snap, c.SLO_TARGET) == {("up:8000", SLO, "ttft"): 0.5, ("up:8000", SLO, "tpot"): 0.05,
                                          ("up:8000", "ttft=0.2", "ttft"): 0.2}


def test_no_slo_no_goodput_series() -> None:
    clock = FakeClock()
    s = stats(clock, slos=())
    s.observe(rec(clock.monotonic()))
    snap = s.snapshot(clock.monotonic() + 1)
    assert not values(snap, c.GOODPUT_RATIO) and not values(snap, c.SLO_REQUESTS)


# -- windows ---------------------------------------------------------------------------------------------


def test_percentile_interpolates_between_closest_ranks() -> None:
    data = [float(i) for i in range(1, 101)]
    assert percentile(data, 50) == pytest.approx(50.5)
    assert percentile(data, 90) == pytest.approx(90.1)
    assert percentile(data, 99) == pytest.approx(99.01)
    assert percentile([3.0], 99) == 3.0 and percentile([], 50) is None


def test_exact_windows_expire_with_the_clock() -> None:
    w = ExactWindows({"10s": 10.0, "1m": 60.0})
    for i in range(20):
        w.add(100.0 + i, float(i))  # values 0..19 at t = 100..119
    got = w.percentiles(120.0, (50.0,))
    assert got["10s"][50.0] == pytest.approx(percentile([float(i) for i in range(10, 20)], 50))
    assert got["1m"][50.0] == pytest.approx(9.5)
    assert "10s" not in w.percentiles(135.0, (50.0,))
    assert w.percentiles(181.0, (50.0,)) == {} and len(w) == 0


def test_exact_windows_stay_bounded() -> None:
    w = ExactWindows({"1m": 60.0}, max_values=100)
    for i in range(10_000):
        w.add(1.0 + i * 1e-4, float(i))
    assert len(w) == 100 and min(w.window_values(2.0, 60.0)) == 9_900.0


def test_gap_sketch_is_within_its_relative_error() -> None:
    rng = random.Random(7)
    gaps = [rng.lognormvariate(math.log(0.02), 0.8) for _ in range(5000)] + [0.0] * 50
    sketch = GapSketch({"1m": 60.0}, alpha=0.005)
    sketch.add_many(10.0, gaps)
    ordered = sorted(gaps)
    got = sketch.percentiles(10.5, (1.0, 50.0, 90.0, 99.0, 99.9))["1m"]
    for q, value in got.items():
        exact = ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]  # nearest rank
        assert value == pytest.approx(exact, rel=0.005, abs=1e-12), q
    assert got[1.0] < got[50.0] < got[99.0]


def test_gap_sketch_windows_forget_old_slots() -> None:
    s = GapSketch({"10s": 10.0, "1m": 60.0})
    s.add_many(100.2, [0.5] * 10)
    s.add_many(105.2, [0.01] * 10)
    got = s.percentiles(112.0, (50.0, 99.0))
    assert got["10s"][99.0] == pytest.approx(0.01, rel=0.005)  # the 0.5 s gaps left the 10 s window
    assert got["1m"][99.0] == pytest.approx(0.5, rel=0.005)  # but not the minute
    assert got["1m"][50.0] == pytest.approx(0.01, rel=0.005)
    assert s.percentiles(170.0, (50.0,)) == {}


def test_snapshot_percentiles_per_window() -> None:
    clock = FakeClock()
    s = stats(clock)
    t0 = clock.monotonic()
    ttfts = [0.05 * (i + 1) for i in range(10)]
    for i, ttft in enumerate(ttfts):
        s.observe(rec(t0 + i, ttft=ttft, gaps=(0.01, 0.03)))
    snap = s.snapshot(t0 + 10)
    ttft = values(snap, c.TTFT)
    assert ttft[("up:8000", "10s", "90")] == pytest.approx(percentile(sorted(ttfts), 90))
    assert ttft[("up:8000", "5m", "50")] == pytest.approx(percentile(sorted(ttfts), 50))
    tpot = values(snap, c.TPOT)
    assert tpot[("up:8000", "1m", "50")] == pytest.approx(0.02)
    itl = values(snap, c.ITL)
    assert itl[("up:8000", "1m", "99")] == pytest.approx(0.03, rel=0.005)
    e2e = values(snap, c.E2E)
    assert e2e[("up:8000", "1m", "50")] == pytest.approx(percentile(sorted(t + 0.04 for t in ttfts), 50))


# -- histograms, counters, tenants ------------------------------------------------------------------------


def test_slo_targets_become_histogram_edges() -> None:
    edges = histogram_edges(c.DEFAULT_BUCKETS, parse_slos(["ttft=0.33,tpot=0.042", "e2e=7"]))
    assert 0.33 in edges["ttft"] and 0.042 in edges["tpot"] and 7.0 in edges["e2e"]
    assert 0.042 not in edges["itl"] and list(edges["ttft"]) == sorted(edges["ttft"])


def test_histograms_and_token_counters() -> None:
    clock = FakeClock()
    s = stats(clock)
    t0 = clock.monotonic()
    s.observe(rec(t0, ttft=0.5, gaps=(0.01, 0.02, 0.02)))  # 0.5 is an edge: le is inclusive
    s.observe(rec(t0, ttft=0.6, gaps=(), status=500))  # a failed request: TTFT seen, no e2e/TPOT
    snap = s.snapshot(t0 + 1)
    hists = {(h.name, h.labels): h for h in snap.histograms}
    ttft = hists[(c.TTFT_HISTOGRAM, ("up:8000", "chat"))]
    le = dict(zip(ttft.bounds, ttft.cumulative))
    assert le[0.5] == 1 and le[0.75] == 2 and ttft.cumulative[-1] == 2 and ttft.sum == pytest.approx(1.1)
    assert hists[(c.ITL_HISTOGRAM, ("up:8000", "chat"))].cumulative[-1] == 3
    assert hists[(c.E2E_HISTOGRAM, ("up:8000", "chat"))].cumulative[-1] == 1
    assert hists[(c.TPOT_HISTOGRAM, ("up:8000", "chat"))].sum == pytest.approx(0.05 / 3)
    assert values(snap, c.OUTPUT_TOKENS) == {("up:8000", "none", "usage"): 5.0}
    requests = values(snap, c.REQUESTS)
    assert requests[("up:8000", "chat", "true", "200", "stop", "none")] == 1.0
    assert requests[("up:8000", "chat", "true", "500", "stop", "none")] == 1.0


def test_tenant_keys_are_hashed_and_top_n_bounds_the_labels() -> None:
    assert tenant_key("acme") == tenant_key(" acme ") != tenant_key("acme2")
    assert tenant_key(None) is None and tenant_key("") is None and len(tenant_key("x") or "") == 12
    top = TenantTop(2)
    labels = [top.label(k) for k in ["a", "b", "c", "c", "c", "c", None]]
    assert labels == ["a", "b", "other", "other", "other", "other", "none"]
    assert top.refresh() == frozenset({"c", "a"})  # c is now the heaviest; a and b tie, a came first
    assert top.label("c") == "c" and top.label("b") == "other"


def test_tenant_table_and_series_stay_bounded() -> None:
    clock = FakeClock()
    s = stats(clock, tenant_top=2)
    t0 = clock.monotonic()
    for i in range(500):
        s.observe(rec(t0, tenant=tenant_key(f"tenant-{i % 50}")))
        if i % 25 == 0:
            s.snapshot(t0 + 1)
    snap = s.snapshot(t0 + 1)
    tenants = {labels[5] for labels in values(snap, c.REQUESTS)}
    assert len(tenants) <= 2 * 2 + 2 and "other" in tenants
    assert sum(values(snap, c.REQUESTS).values()) <= 500
    assert len(s._tenants._counts) <= s._tenants.capacity


# -- exposition ---------------------------------------------------------------------------------------------


def test_exposition_serves_the_catalog_and_renders_only_the_snapshot() -> None:
    clock = FakeClock()
    s = stats(clock, tenant_top=3)
    t0 = clock.monotonic()
    s.observe(rec(t0, tenant=tenant_key("secret-api-key")))
    s.observe(rec(t0, route="other", stream=False, gaps=(), ttft=None, finish="none"))
    s.observe(rec(t0, status=502, outcome=UPSTREAM_ERROR))
    s.accounting_error()
    snap = s.snapshot(t0 + 1)
    text = generate_latest(registry_for(lambda: snap)).decode()
    assert "secret-api-key" not in text and tenant_key("secret-api-key") in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    served = {f.name + ("_total" if f.type == "counter" else "") for f in families.values()}
    assert served <= set(c.BY_NAME) and {c.REQUESTS, c.TTFT, c.GOODPUT_RATIO, c.ACCOUNTING_ERRORS} <= served
    for f in families.values():
        d = c.BY_NAME[f.name + ("_total" if f.type == "counter" else "")]
        assert f.type == d.type
        for sample in f.samples:
            assert set(sample.labels) - {"le"} == set(d.labels), (f.name, sample.labels)
    s.observe(rec(t0 + 0.5))  # not in the frozen snapshot: a scrape does no accounting work
    again = generate_latest(registry_for(lambda: snap)).decode()
    assert again == text


def test_catalog_names_follow_the_conventions() -> None:
    for d in c.CATALOG:
        assert re.fullmatch(r"rooflight_client_[a-z0-9_]+", d.name), d.name
        assert d.name.endswith("_total") == (d.type == "counter"), d.name
        assert d.type != "histogram" or d.name.endswith("_seconds")
        assert "quantile" not in d.labels and "le" not in d.labels
        if d.name.endswith("_ratio"):
            assert d.unit == "ratio"
    assert c.markdown_table().count("\n") == len(c.CATALOG) + 2
