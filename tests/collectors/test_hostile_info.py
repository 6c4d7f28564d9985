"""What engine info says is cut, bounded and counted before it reaches /metrics or the physics.

Unbounded, a 200 KB `/v1/models` root became a label value, `"tp_size": 1e308` was
exported as rooflight_tensor_parallel_size 1e+308, `num_gpu_blocks="1e308"` made an infinite KV pool, and a
3 MB metric name became a 3 MB log line.
"""

from __future__ import annotations

import pytest

from rooflight.collectors import engines, expfmt, llamacpp, sglang, tgi, trtllm, vllm
from rooflight.collectors.common import INFO_OUT_OF_RANGE, MAX_INFO_CHARS, MAX_KV_BLOCKS
from rooflight.collectors.samples import MAX_SETTING_CHARS, setting_value

CUT = MAX_INFO_CHARS + len(expfmt.TRUNCATED_MARK)


def _refused(call: object) -> tuple[object, int]:
    """call() under fresh Bounds, and how many values it refused as out of range."""
    with expfmt.bounded(expfmt.Bounds()) as bounds:
        out = call()  # type: ignore[operator]
    return out, bounds.values_dropped.get(INFO_OUT_OF_RANGE, 0)


def test_a_huge_model_root_is_cut_with_the_mark() -> None:
    hints = vllm.parse_info({"data": [{"id": "m", "root": "/" + "X" * 200_000, "max_model_len": 8192}]})
    assert hints.model_id is not None and len(hints.model_id) == CUT
    assert hints.model_id.endswith(expfmt.TRUNCATED_MARK)
    assert hints.max_model_len == 8192


@pytest.mark.parametrize("parse, data", [
    (tgi.parse_info, {"model_id": "m" * 5000}),
    (llamacpp.parse_info, {"model_path": "m" * 5000}),
    (sglang.parse_info, {"model_path": "m" * 5000}),
])
def test_every_engines_model_string_is_cut(parse: object, data: dict) -> None:
    hints = parse(data)  # type: ignore[operator]
    assert hints.model_id is not None and len(hints.model_id) == CUT


def test_a_short_model_id_is_kept_as_written() -> None:
    assert sglang.parse_info({"model_path": "meta-llama/Llama-3.1-8B"}).model_id == "meta-llama/Llama-3.1-8B"


def test_absurd_tp_and_batch_caps_are_refused_and_counted() -> None:
    hints, refused = _refused(lambda: sglang.parse_info(
        {"model_path": "m", "tp_size": 1e308, "max_running_requests": "1e308", "context_length": 1e300}))
    assert hints.tensor_parallel_size is None
    assert hints.batch_max_requests is None
    assert hints.max_model_len is None
    assert refused == 3
    assert all(len(v) <= MAX_SETTING_CHARS for v in hints.settings.values())


def test_plausible_tp_and_batch_caps_are_kept() -> None:
    hints, refused = _refused(lambda: sglang.parse_info(
        {"model_path": "m", "tp_size": 8, "max_running_requests": 1024, "context_length": 131072}))
    assert (hints.tensor_parallel_size, hints.batch_max_requests, hints.max_model_len) == (8, 1024, 131072)
    assert refused == 0


def test_llamacpp_slots_past_the_cap_are_refused() -> None:
    hints, refused = _refused(lambda: llamacpp.parse_info({"total_slots": 10**7}))
    assert hints.batch_max_requests is None and refused == 1


@pytest.mark.parametrize("value", [1e308, float(10**70), -1e308])
def test_a_float_setting_is_cut_like_an_int(value: float) -> None:
    text = setting_value(value)
    assert text is not None and len(text) <= MAX_SETTING_CHARS


@pytest.mark.parametrize("config", [
    {"num_gpu_blocks": "1e308", "block_size": "16"},
    {"num_gpu_blocks": str(MAX_KV_BLOCKS * 10), "block_size": "16"},
    {"num_gpu_blocks": "1000", "block_size": "1e300"},
    {"num_gpu_blocks": "0", "block_size": "16"},
    {"kv_cache_size_tokens": "1e300"},
])
def test_an_absurd_kv_pool_is_no_capacity_and_counted(config: dict[str, str]) -> None:
    capacity, refused = _refused(lambda: vllm.kv_capacity_tokens(config))
    assert capacity is None
    assert refused >= 1


def test_a_real_kv_pool_is_blocks_times_block_size() -> None:
    capacity, refused = _refused(lambda: vllm.kv_capacity_tokens({"num_gpu_blocks": "27000", "block_size": "16"}))
    assert capacity == 27000 * 16 and refused == 0


def test_trtllm_tp_label_out_of_range_is_none() -> None:
    page = 'trtllm_parallel_config_info{tensor_parallel_size="1e308"} 1\n'
    exp = expfmt.parse(page)
    assert trtllm.engine_info(exp, None).tensor_parallel_size is None
    exp = expfmt.parse(page.replace("1e308", "4"))
    assert trtllm.engine_info(exp, None).tensor_parallel_size == 4


def test_a_huge_metric_name_makes_a_short_description() -> None:
    text = "A" * 3_000_000 + " 1\n"
    said = engines.describe(text)
    assert len(said) < 1000
    assert expfmt.TRUNCATED_MARK in said


def test_sglang_disaggregation_mode_is_the_targets_role() -> None:
    from rooflight.agent.signals.headroom import role_for
    from rooflight.collectors import sglang

    for mode, role in (("prefill", "prefill"), ("decode", "decode"), ("null", "both"), (None, "both"), (7, "both")):
        hints = sglang.parse_info({"model_path": "m", "disaggregation_mode": mode})
        assert role_for(None, hints.role) == role, mode
    assert role_for("decode", sglang.parse_info({"disaggregation_mode": "prefill"}).role) == "decode"  # the setting wins
