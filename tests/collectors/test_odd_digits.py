"""A label or setting whose characters are digits to str.isdigit() but not to int() ("²", "³", "¹"): read as no
number, never an exception that fails the whole page or the start (a reviewer found `engine="²"` failed every
vLLM page it was on)."""

from __future__ import annotations

import pytest

from rooflight.agent.config.values import split_listen
from rooflight.agent.errors import ConfigError
from rooflight.collectors import gpu_map, sglang, triton_trtllm, vllm

ODD = ("²", "³¹", "١")  # superscripts: isdigit() but not int(); an Arabic-Indic one: int() reads it


@pytest.mark.parametrize("rank", ODD)
def test_a_vllm_rank_of_odd_digits_is_read(rank: str) -> None:
    page = (f'vllm:num_requests_running{{engine="{rank}",model_name="m"}} 3\n'
            f'vllm:cache_config_info{{block_size="16",engine="{rank}"}} 1\n'
            'vllm:cache_config_info{block_size="32",engine="0"} 1\n')
    sample = vllm.parse(page, target="t", timestamp=1.0, duration=0.1)
    assert [(s.rank, s.running) for s in sample.series] == [(rank, 3.0)]
    assert sample.info.kv_block_size_tokens == (32.0 if not rank.isdecimal() or int(rank) > 0 else 16.0)


@pytest.mark.parametrize("ranks", [("²", "³"), ("a", "b"), ("0", "²")])
def test_sglang_tp_ranks_that_are_no_numbers_give_no_tp(ranks: tuple[str, str]) -> None:
    page = "".join(f'sglang:num_running_reqs{{model_name="m",tp_rank="{r}"}} 1\n' for r in ranks)
    sample = sglang.parse(page, target="t", timestamp=1.0, duration=0.1)
    assert sample.info.tensor_parallel_size == (1 if "0" in ranks else None)


def test_a_triton_version_of_odd_digits_is_no_version() -> None:
    assert triton_trtllm._version({"version": "²"}) == -1
    assert triton_trtllm._version({"version": "2"}) == 2


def test_a_visible_device_of_odd_digits_ends_the_list() -> None:
    assert gpu_map.parse_visible_devices("0,²,1", ("GPU-a", "GPU-b")) == ("GPU-a",)


@pytest.mark.parametrize("port", ["²", "١"])
def test_a_listen_port_of_odd_digits_is_a_config_error(port: str) -> None:
    with pytest.raises(ConfigError, match="HOST:PORT"):
        split_listen(f"127.0.0.1:{port}")
