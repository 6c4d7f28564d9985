"""GPU profiles: the seeds' constants, dense (not sparse) peaks, NVML name matching, dtype fallbacks."""

from __future__ import annotations

import pytest

from rooflight.agent.errors import ConfigError
from rooflight.agent.roofline.gpus import DEFAULT_PROFILE_KEY, PROFILES, get_profile, profile_for_nvml_name

REQUIRED = ("a100-sxm-40gb", "a100-sxm-80gb", "a100-pcie-40gb", "a100-pcie-80gb", "h100-sxm",
            "h100-pcie", "h100-nvl", "h200", "h20", "b200", "l40s", "l4")


def test_required_profiles_exist_and_default_is_h100_sxm() -> None:
    for key in REQUIRED:
        assert PROFILES[key].key == key
    assert DEFAULT_PROFILE_KEY == "h100-sxm"


def test_h100_sxm_matches_the_seeds_assumptions() -> None:
    h = get_profile("h100-sxm")
    assert h.peak_flops["bf16"] == 989e12  # dense, not the 1,979 sparse headline
    assert h.memory_bandwidth_bytes_per_second == 3.35e12
    assert h.memory_bytes == 80e9
    assert round(h.ridge_point) == 295


@pytest.mark.parametrize("key,ridge", [("a100-sxm-80gb", 153), ("h200", 206)])
def test_ridges(key: str, ridge: int) -> None:
    # The seed rounds A100 80GB to 2.0 TB/s (ridge ~156); the datasheet 2,039 GB/s gives 153.
    assert round(get_profile(key).ridge_point) == ridge


def test_seed_a100_ridge_uses_2_tb_per_s() -> None:
    assert round(get_profile("a100-sxm-80gb").peak_flops["bf16"] / 2.0e12) == 156


def test_every_profile_is_dense_and_sane() -> None:
    for p in PROFILES.values():
        assert p.peak_flops["bf16"] == p.peak_flops["fp16"]
        if "fp8" in p.peak_flops:
            assert p.peak_flops["fp8"] == pytest.approx(2 * p.peak_flops["bf16"], rel=0.03)  # L40S: 733 vs 2x362
        assert 20 < p.ridge_point < 500, p.key  # H20 ~37 (capped compute), L40S ~419 (GDDR6)
        assert p.source


def test_dtype_fallbacks() -> None:
    a100, h100 = get_profile("a100-sxm-80gb"), get_profile("h100-sxm")
    assert h100.peak_flops_for("fp8") == 1979e12
    assert a100.peak_flops_for("fp8") == 312e12  # no FP8 tensor cores: 16-bit math
    assert h100.peak_flops_for("int4") == 989e12  # weight-only 4-bit dequantizes to 16 bit
    assert h100.peak_flops_for("INT8") == 1979e12
    assert h100.peak_flops_for("fp32") == 494.5e12
    with pytest.raises(ConfigError):
        h100.peak_flops_for("fp64")


def test_unknown_key_lists_valid_keys() -> None:
    with pytest.raises(ConfigError, match="h100-sxm"):
        get_profile("h1000")
    assert get_profile(" H100 ").key == "h100-sxm"


@pytest.mark.parametrize("name,mem,key", [
    ("NVIDIA H100 80GB HBM3", 81559 * 2**20, "h100-sxm"),
    ("NVIDIA H100 PCIe", None, "h100-pcie"),
    ("NVIDIA H100 NVL", None, "h100-nvl"),
    ("NVIDIA H200", 143771 * 2**20, "h200"),
    ("NVIDIA H200 NVL", None, "h200-nvl"),
    ("NVIDIA H20", None, "h20"),
    ("NVIDIA A100-SXM4-40GB", None, "a100-sxm-40gb"),
    ("NVIDIA A100-SXM4-80GB", None, "a100-sxm-80gb"),
    ("A100-SXM4-80GB", None, "a100-sxm-80gb"),  # older drivers: no "NVIDIA " prefix
    ("NVIDIA A100-PCIE-40GB", None, "a100-pcie-40gb"),
    ("NVIDIA A100 80GB PCIe", None, "a100-pcie-80gb"),
    ("NVIDIA A100-SXM4", 40 * 2**30, "a100-sxm-40gb"),
    ("NVIDIA B200", None, "b200"),
    ("NVIDIA GB200", None, "gb200"),
    ("NVIDIA GH200 480GB", None, "gh200"),
    ("NVIDIA GH200 144G HBM3e", None, "gh200-144gb"),
    ("NVIDIA L40S", 46068 * 2**20, "l40s"),
    ("NVIDIA L40", None, "l40"),
    ("NVIDIA L4", None, "l4"),
    ("NVIDIA A10", None, "a10"),
])
def test_nvml_names(name: str, mem: float | None, key: str) -> None:
    p = profile_for_nvml_name(name, mem)
    assert p is not None and p.key == key


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA H20-3e", "NVIDIA B300 SXM6 AC",
                                  "NVIDIA GeForce RTX 3090", "Tesla T4", ""])
def test_unknown_or_uncertain_names_give_none(name: str) -> None:
    assert profile_for_nvml_name(name) is None
