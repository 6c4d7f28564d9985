"""collectors/normalize.py: the checks between an adapter and the history, pure (a sample in, a sample and
what was withheld out), the same for every engine."""

from __future__ import annotations

from rooflight.collectors import normalize
from rooflight.collectors.common import INFO_OUT_OF_RANGE, MAX_BATCH, MAX_TENSOR_PARALLEL
from rooflight.collectors.samples import EngineInfo, EngineSample, EngineSeries


def _sample(*series: EngineSeries, info: EngineInfo = EngineInfo()) -> EngineSample:
    return EngineSample(target="t", engine="vllm", timestamp=0.0, duration=0.0, series=series, info=info)


def test_a_plausible_sample_is_the_very_object_and_nothing_is_withheld() -> None:
    sample = _sample(EngineSeries("m", kv_usage_ratio=0.5, kv_capacity_tokens=1e5, batch_max_requests=256),
                     info=EngineInfo(tensor_parallel_size=8, kv_block_size_tokens=16))
    checked, withheld = normalize.plausible(sample)
    assert checked is sample and withheld == {}


def test_impossible_values_are_withheld_and_counted_by_reason() -> None:
    sample = _sample(EngineSeries("m", kv_usage_ratio=1e308, kv_capacity_tokens=0.0, batch_max_requests=MAX_BATCH * 2),
                     EngineSeries("n", kv_usage_ratio=-0.1, running=3.0),
                     info=EngineInfo(tensor_parallel_size=MAX_TENSOR_PARALLEL + 1, kv_block_size_tokens=16))
    checked, withheld = normalize.plausible(sample)
    m, n = checked.series
    assert (m.kv_usage_ratio, m.kv_capacity_tokens, m.batch_max_requests) == (None, None, None)
    assert (n.kv_usage_ratio, n.running) == (None, 3.0)  # the rest of the series kept
    assert (checked.info.tensor_parallel_size, checked.info.kv_block_size_tokens) == (None, 16)
    assert withheld == {normalize.KV_USAGE_OUT_OF_RANGE: 2, INFO_OUT_OF_RANGE: 3}
    assert sample.series[0].kv_usage_ratio == 1e308  # the input is left as it was


def test_the_series_cap_keeps_tracked_series_first_then_page_order() -> None:
    sample = _sample(*(EngineSeries(f"m{i}") for i in range(5)))
    same, dropped = normalize.capped(sample, 5, set())
    assert same is sample and dropped == 0
    capped, dropped = normalize.capped(sample, 3, {("m4", "0"), ("m3", "0")})
    assert [s.model for s in capped.series] == ["m3", "m4", "m0"] and dropped == 2


def test_request_counts_and_ratios_outside_their_range_are_withheld_for_every_engine() -> None:
    """A Dynamo frontend's `inflight_requests 1e308` was exported as rooflight_requests_running 1e+308: a gauge
    the page states is checked here whatever the engine, like KV occupancy."""
    sample = _sample(EngineSeries("m", running=1e308, waiting=-1.0, waiting_by_reason={"capacity": 1e20, "other": 2.0},
                                  prefix_cache_hit_ratio=1.5),
                     EngineSeries("n", running=normalize.MAX_REQUESTS, waiting=0.0, prefix_cache_hit_ratio=1.0))
    checked, withheld = normalize.plausible(sample)
    m, n = checked.series
    assert (m.running, m.waiting, dict(m.waiting_by_reason), m.prefix_cache_hit_ratio) == (None, None, {"other": 2.0}, None)
    assert n is sample.series[1]  # at the bounds: kept as it came
    assert withheld == {normalize.GAUGE_OUT_OF_RANGE: 4}
