"""GPU profiles: the constants of docs/physics.md, dense (not sparse) peaks, NVML name matching, dtype fallbacks."""

from __future__ import annotations

import pytest

from rooflight.agent.errors import ConfigError
from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.roofline.gpus import (DEFAULT_PROFILE_KEY, PROFILES, UNKNOWN_GPU, get_profile, match_nvml_name,
                                          unknown_gpu_reason)
from rooflight.agent.roofline.models import preset

REQUIRED = ("a100-sxm-40gb", "a100-sxm-80gb", "a100-pcie-40gb", "a100-pcie-80gb", "h100-sxm",
            "h100-pcie", "h100-nvl", "h200", "h20", "b200", "l40s", "l4")


def test_required_profiles_exist_and_default_is_h100_sxm() -> None:
    for key in REQUIRED:
        assert PROFILES[key].key == key
    assert DEFAULT_PROFILE_KEY == "h100-sxm"


def test_h100_sxm_matches_the_reference_gpu() -> None:
    h = get_profile("h100-sxm")
    assert h.peak_flops["bf16"] == 989e12  # dense, not the 1,979 sparse headline
    assert h.memory_bandwidth_bytes_per_second == 3.35e12
    assert h.memory_bytes == 80e9
    assert round(h.ridge_point) == 295


@pytest.mark.parametrize("key,ridge", [("a100-sxm-80gb", 153), ("h200", 206)])
def test_ridges(key: str, ridge: int) -> None:
    # A100 80GB is often rounded to 2.0 TB/s (ridge ~156); the datasheet 2,039 GB/s gives 153.
    assert round(get_profile(key).ridge_point) == ridge


def test_rounded_a100_ridge_uses_2_tb_per_s() -> None:
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
    ("NVIDIA RTX 6000 Ada Generation", None, "rtx-6000-ada"),
    ("NVIDIA GeForce RTX 4090", None, "rtx-4090"),
    ("NVIDIA B300 SXM6 AC", None, "b300"),
    ("NVIDIA GB300", None, "gb300"),
])
def test_nvml_names(name: str, mem: float | None, key: str) -> None:
    p = match_nvml_name(name, mem).profile
    assert p is not None and p.key == key


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA H20-3e", "NVIDIA H800", "NVIDIA A800-SXM4-80GB",
                                  "Quadro RTX 6000", "NVIDIA GeForce RTX 3090", "Tesla T4", ""])
def test_unknown_or_uncertain_names_give_none(name: str) -> None:
    assert match_nvml_name(name).profile is None


def test_unknown_gpus_say_why_and_never_borrow_the_default_profile() -> None:
    a10g = match_nvml_name("NVIDIA A10G")
    assert a10g.profile is None and a10g.key == UNKNOWN_GPU == "unknown"
    assert "A10G" in a10g.reason and "125" in a10g.reason and "--gpu" in a10g.reason
    h800 = match_nvml_name("NVIDIA H800", 81559 * 2**20)
    assert h800.profile is None and "no dense peaks on file for 'NVIDIA H800'" in h800.reason
    assert "MBU and MFU are left absent" in unknown_gpu_reason("NVIDIA A800-SXM4-80GB")
    assert match_nvml_name("NVIDIA H100 80GB HBM3").key == "h100-sxm"


def test_new_profiles_carry_the_reference_table_figures() -> None:
    ada, rtx, b300 = get_profile("rtx-6000-ada"), get_profile("rtx-4090"), get_profile("b300")
    assert (ada.peak_flops["bf16"], ada.peak_flops["fp8"], ada.memory_bandwidth_bytes_per_second) == (
        364.2e12, 728.5e12, 0.96e12)
    assert rtx.peak_flops["bf16"] == 165.2e12  # FP32-accumulate, what PyTorch uses
    assert b300.peak_flops_for("int8") == 2250e12  # INT8 not settled: the 16-bit peak
    assert get_profile("mi300x").peak_flops["bf16"] == 1307.4e12 and not get_profile("mi300x").nvml_names


def test_peak_dtype_for_names_the_peak_a_dtype_runs_at() -> None:
    h100, a100 = get_profile("h100-sxm"), get_profile("a100")
    assert [h100.peak_dtype_for(d) for d in ("fp8", "int4", "fp4", "fp16", "fp32")] == [
        "fp8", "bf16", "bf16", "fp16", "tf32"]
    assert a100.peak_dtype_for("fp8") == "bf16"


def test_target_constants_for_an_unknown_gpu_have_no_peaks() -> None:
    model = preset("llama-3-8b")
    unknown = TargetConstants(model=model, gpu=None, gpu_source="nvml", tensor_parallel_size=2,
                              gpu_note=unknown_gpu_reason("NVIDIA A10G"))
    assert unknown.peak_flops is None and unknown.peak_bandwidth is None and unknown.peak_flops_per_gpu is None
    assert unknown.gpu_key == "unknown" and unknown.compute_dtype == "bf16" and "A10G" in unknown.gpu_note
    known = TargetConstants(model=model, gpu=get_profile("h100"), gpu_source="flag", tensor_parallel_size=2)
    assert known.peak_flops == 2 * 989e12 and known.peak_bandwidth == 2 * 3.35e12 and known.gpu_key == "h100-sxm"


def test_target_constants_use_the_models_gemm_dtype() -> None:
    h100 = get_profile("h100")
    gptq8 = preset("llama-3-8b").with_dtypes("int8", None)  # weight-only: 16-bit GEMMs
    fp8 = preset("llama-3-8b").with_dtypes("fp8", None)
    assert TargetConstants(model=gptq8, gpu=h100, gpu_source="flag").peak_flops == 989e12
    assert TargetConstants(model=fp8, gpu=h100, gpu_source="flag").peak_flops == 1979e12
    assert TargetConstants(model=fp8, gpu=get_profile("a100"), gpu_source="flag").compute_dtype == "bf16"
