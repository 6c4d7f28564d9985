"""GPU constants: per-GPU dense peaks, HBM bandwidth and capacity, and how to pick a profile.

Owns the numbers every MBU/MFU/roofline figure divides by. All values are per GPU, dense (no 2:4
sparsity: NVIDIA datasheets quote Hopper/Ada/Blackwell tensor peaks *with* sparsity, and those are
halved here), in base units: FLOP/s, bytes/s, bytes. Bandwidth and memory are decimal (3.35 TB/s =
3.35e12 B/s, 80 GB = 80e9 B), as the datasheets write them. The table and its sources are in
docs/physics.md, section GPU constants, and repeated per profile in `source`.

A profile is chosen by key (`--gpu h100-sxm`) or from the NVML device name (plus total memory where
the name does not say which memory variant it is). A detected GPU with no profile is unknown
(match_nvml_name gives the reason): the caller leaves MBU/MFU absent rather than divide by another
GPU's peaks; DEFAULT_PROFILE_KEY is only the plan's what-if default. Peaks are per GPU: for a model
spread over `tp` GPUs the caller multiplies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from rooflight.agent.errors import ConfigError

DEFAULT_PROFILE_KEY = "h100-sxm"

# Weight dtypes whose GEMMs do not run natively at that width: weight-only 4-bit schemes (AWQ, GPTQ,
# MXFP4/NVFP4 on pre-Blackwell kernels) dequantize into 16-bit tensor-core math, so the 16-bit peak
# is the honest denominator for their MFU. fp32 runs as TF32 where the GPU has it.
_FALLBACK: Mapping[str, tuple[str, ...]] = {
    "int4": ("bf16",),
    "fp4": ("fp4", "bf16"),  # no profile lists an FP4 peak yet: NVFP4/MXFP4 MFU uses the 16-bit one
    "fp8": ("fp8", "bf16"),  # no FP8 tensor cores (Ampere): vLLM runs FP8 weight-only, 16-bit math
    "int8": ("int8", "bf16"),
    "fp32": ("tf32", "bf16"),
    "tf32": ("tf32", "bf16"),
    "fp16": ("fp16", "bf16"),
    "bf16": ("bf16", "fp16"),
}


@dataclass(frozen=True)
class Link:
    """How one GPU talks to the others of its tensor-parallel group: a fixed latency per all-reduce and the
    bytes/s it moves in one direction. Behind a switch (NVLink + NVSwitch) that is the GPU's whole link
    bandwidth whatever the group's size; over a fully connected mesh (AMD Infinity Fabric, 7 links a GPU)
    each peer has its own link, so a group of tp GPUs reaches tp - 1 links (docs/physics.md, section TP
    communication in plan's ceilings and pools)."""

    name: str
    latency_seconds: float
    bytes_per_second: float  # one direction: per GPU behind a switch, per peer link on a mesh
    mesh: bool = False

    def all_reduce_bytes_per_second(self, tp: int) -> float:
        """One direction's bytes/s a GPU of a tp-GPU group moves in an all-reduce."""
        return self.bytes_per_second * max(tp - 1, 1) if self.mesh else self.bytes_per_second


NVLINK_LATENCY_SECONDS = 5e-6  # fixed launch-plus-latency floor of one small all-reduce on NVLink (and a mesh)
PCIE_LATENCY_SECONDS = 25e-6  # the same floor across PCIe
NVLINK3 = Link("NVLink 3", NVLINK_LATENCY_SECONDS, 300e9)  # A100 SXM: 600 GB/s a GPU, both directions
NVLINK4 = Link("NVLink 4", NVLINK_LATENCY_SECONDS, 450e9)  # H100/H200 SXM, GH200: 900 GB/s a GPU
NVLINK4_BRIDGE = Link("NVLink bridge", NVLINK_LATENCY_SECONDS, 300e9)  # H100 NVL: 600 GB/s a GPU
NVLINK4_NVL = Link("NVLink bridge", NVLINK_LATENCY_SECONDS, 450e9)  # H200 NVL: 900 GB/s a GPU
NVLINK5 = Link("NVLink 5", NVLINK_LATENCY_SECONDS, 900e9)  # Blackwell: 1.8 TB/s a GPU
PCIE = Link("PCIe", PCIE_LATENCY_SECONDS, 25e9)  # PCIe Gen4 x16, one direction, as an all-reduce sees it
# PCIe Gen5 x16 (H100 PCIe datasheet: 128 GB/s both ways, 64 one way, twice Gen4's 64 / 32): the same 78% of the
# one-way rate an all-reduce sees on Gen4 (25 of 32 GB/s)
PCIE5 = Link("PCIe Gen5", PCIE_LATENCY_SECONDS, 50e9)
INFINITY_FABRIC3 = Link("Infinity Fabric", NVLINK_LATENCY_SECONDS, 64e9, mesh=True)  # MI300X/MI325X: 128 GB/s a link
INFINITY_FABRIC4 = Link("Infinity Fabric", NVLINK_LATENCY_SECONDS, 76.8e9, mesh=True)  # MI355X: 153.6 GB/s a link


@dataclass(frozen=True)
class GpuProfile:
    """Constants of one GPU model. `peak_flops` keys: bf16, fp16, fp8, int8, tf32 where it has them."""

    key: str
    name: str
    peak_flops: Mapping[str, float]
    memory_bandwidth_bytes_per_second: float
    memory_bytes: float
    source: str
    nvml_names: tuple[str, ...] = field(default=())
    link: Link = NVLINK4  # what its tensor-parallel all-reduces run over

    def peak_flops_for(self, dtype: str) -> float:
        """Dense peak FLOP/s (or OP/s) for GEMMs whose weights are in `dtype`.

        int4/fp4 fall back to the 16-bit peak (weight-only quantization computes in 16 bit); fp8 and
        int8 fall back to 16 bit on GPUs without those tensor cores; fp32 uses TF32, else 16 bit.
        """
        return self.peak_flops[self.peak_dtype_for(dtype)]

    def peak_dtype_for(self, dtype: str) -> str:
        """The key of `peak_flops` that GEMMs in `dtype` run at on this GPU (see peak_flops_for)."""
        d = dtype.lower()
        for candidate in _FALLBACK.get(d, (d,)):
            if candidate in self.peak_flops:
                return candidate
        raise ConfigError(f"GPU profile {self.key} has no peak for dtype {dtype!r}")

    @property
    def ridge_point(self) -> float:
        """bf16 FLOPs per byte at which this GPU turns from memory-bound to compute-bound."""
        return self.peak_flops_for("bf16") / self.memory_bandwidth_bytes_per_second


def _peaks(bf16: float, fp8: float | None, int8: float | None, tf32: float | None) -> Mapping[str, float]:
    """TFLOPS/TOPS (dense) -> FLOP/s mapping; fp16 tensor peak equals bf16 on every GPU listed."""
    out = {"bf16": bf16 * 1e12, "fp16": bf16 * 1e12}
    for key, value in (("fp8", fp8), ("int8", int8), ("tf32", tf32)):
        if value is not None:
            out[key] = value * 1e12
    return MappingProxyType(out)


def _p(key: str, name: str, *, bf16: float, fp8: float | None, int8: float | None, tf32: float | None,
       bw_tb: float, mem_gb: float, source: str, nvml: tuple[str, ...], link: Link = NVLINK4) -> GpuProfile:
    return GpuProfile(key=key, name=name, peak_flops=_peaks(bf16, fp8, int8, tf32),
                      memory_bandwidth_bytes_per_second=bw_tb * 1e12, memory_bytes=mem_gb * 1e9,
                      source=source, nvml_names=nvml, link=link)


_DS = "NVIDIA datasheet (sparse figures halved); see docs/physics.md, section GPU constants"

_ALL = (
    _p("a100-sxm-40gb", "NVIDIA A100 SXM4 40GB", bf16=312, fp8=None, int8=624, tf32=156,
       bw_tb=1.555, mem_gb=40, source="A100 datasheet", nvml=("NVIDIA A100-SXM4-40GB",), link=NVLINK3),
    _p("a100-sxm-80gb", "NVIDIA A100 SXM4 80GB", bf16=312, fp8=None, int8=624, tf32=156,
       bw_tb=2.039, mem_gb=80, source="A100 datasheet", nvml=("NVIDIA A100-SXM4-80GB",), link=NVLINK3),
    _p("a100-pcie-40gb", "NVIDIA A100 PCIe 40GB", bf16=312, fp8=None, int8=624, tf32=156,
       bw_tb=1.555, mem_gb=40, source="A100 datasheet", nvml=("NVIDIA A100-PCIE-40GB",), link=PCIE),
    _p("a100-pcie-80gb", "NVIDIA A100 PCIe 80GB", bf16=312, fp8=None, int8=624, tf32=156,
       bw_tb=1.935, mem_gb=80, source="A100 datasheet", nvml=("NVIDIA A100 80GB PCIe",), link=PCIE),
    _p("h100-sxm", "NVIDIA H100 SXM5 80GB", bf16=989, fp8=1979, int8=1979, tf32=494.5,
       bw_tb=3.35, mem_gb=80, source="H100 datasheet/whitepaper, " + _DS,
       nvml=("NVIDIA H100 80GB HBM3",)),
    _p("h100-pcie", "NVIDIA H100 PCIe 80GB", bf16=756, fp8=1513, int8=1513, tf32=378,
       bw_tb=2.0, mem_gb=80, source="H100 datasheet/whitepaper, " + _DS, nvml=("NVIDIA H100 PCIe",), link=PCIE5),
    _p("h100-nvl", "NVIDIA H100 NVL 94GB", bf16=835, fp8=1670, int8=1670, tf32=417.5,
       bw_tb=3.9, mem_gb=94, source="H100 datasheet, " + _DS, nvml=("NVIDIA H100 NVL",), link=NVLINK4_BRIDGE),
    _p("h200", "NVIDIA H200 SXM 141GB", bf16=989, fp8=1979, int8=1979, tf32=494.5,
       bw_tb=4.8, mem_gb=141, source="H200 datasheet, " + _DS, nvml=("NVIDIA H200",)),
    _p("h200-nvl", "NVIDIA H200 NVL 141GB", bf16=835, fp8=1670, int8=1670, tf32=None,
       bw_tb=4.8, mem_gb=141, source="H200 datasheet, " + _DS, nvml=("NVIDIA H200 NVL",), link=NVLINK4_NVL),
    _p("h20", "NVIDIA H20 96GB", bf16=148, fp8=296, int8=296, tf32=None,
       bw_tb=4.0, mem_gb=96, source="uncertain: no public NVIDIA datasheet; widely reported figures",
       nvml=("NVIDIA H20",)),
    _p("gh200", "NVIDIA GH200 (GPU, 96GB HBM3)", bf16=989, fp8=1979, int8=1979, tf32=494.5,
       bw_tb=4.0, mem_gb=96, source="GH200 datasheet, " + _DS,
       nvml=("NVIDIA GH200 480GB", "NVIDIA GH200 120GB")),
    _p("gh200-144gb", "NVIDIA GH200 (GPU, 144GB HBM3e)", bf16=989, fp8=1979, int8=1979, tf32=494.5,
       bw_tb=4.9, mem_gb=144, source="GH200 datasheet, " + _DS, nvml=("NVIDIA GH200 144G HBM3e",)),
    _p("b200", "NVIDIA B200 (HGX, 180GB)", bf16=2250, fp8=4500, int8=4500, tf32=None,
       bw_tb=8.0, mem_gb=180, source="DGX B200 datasheet, " + _DS, nvml=("NVIDIA B200",), link=NVLINK5),
    _p("gb200", "NVIDIA GB200 (per Blackwell GPU)", bf16=2500, fp8=5000, int8=5000, tf32=None,
       bw_tb=8.0, mem_gb=186, source="GB200 NVL72 datasheet, per GPU, " + _DS, nvml=("NVIDIA GB200",), link=NVLINK5),
    _p("l40s", "NVIDIA L40S 48GB", bf16=362, fp8=733, int8=733, tf32=183,
       bw_tb=0.864, mem_gb=48, source="L40S datasheet, " + _DS, nvml=("NVIDIA L40S",), link=PCIE),
    _p("l40", "NVIDIA L40 48GB", bf16=181, fp8=362, int8=362, tf32=None,
       bw_tb=0.864, mem_gb=48, source="L40 datasheet, " + _DS, nvml=("NVIDIA L40",), link=PCIE),
    _p("l4", "NVIDIA L4 24GB", bf16=121, fp8=242.5, int8=242.5, tf32=60,
       bw_tb=0.300, mem_gb=24, source="L4 datasheet, " + _DS, nvml=("NVIDIA L4",), link=PCIE),
    _p("a10", "NVIDIA A10 24GB", bf16=125, fp8=None, int8=250, tf32=62.5,
       bw_tb=0.600, mem_gb=24, source="A10 datasheet, " + _DS, nvml=("NVIDIA A10",), link=PCIE),
    _p("b300", "NVIDIA B300 (HGX, Blackwell Ultra, 288GB)", bf16=2250, fp8=4500, int8=None, tf32=None,
       bw_tb=8.0, mem_gb=288, source="DGX B300 datasheet, " + _DS + "; INT8 peak not settled, so "
       "int8 GEMMs use the 16-bit peak; NVML reports ~270 GB usable", nvml=("NVIDIA B300 SXM6 AC",), link=NVLINK5),
    _p("gb300", "NVIDIA GB300 (per Blackwell Ultra GPU)", bf16=2500, fp8=5000, int8=None, tf32=None,
       bw_tb=8.0, mem_gb=288, source="GB300 NVL72, per GPU (as GB200 but memory), " + _DS,
       nvml=("NVIDIA GB300",), link=NVLINK5),
    _p("rtx-6000-ada", "NVIDIA RTX 6000 Ada Generation 48GB", bf16=364.2, fp8=728.5, int8=728.5,
       tf32=None, bw_tb=0.960, mem_gb=48, source="RTX 6000 Ada datasheet (1,457 TFLOPS FP8 is with "
       "sparsity), " + _DS, nvml=("NVIDIA RTX 6000 Ada Generation",), link=PCIE),
    _p("rtx-4090", "NVIDIA GeForce RTX 4090 24GB", bf16=165.2, fp8=330.3, int8=660.6, tf32=None,
       bw_tb=1.008, mem_gb=24, source="Ada Lovelace whitepaper: GeForce tensor math with FP32 "
       "accumulate (what PyTorch and vLLM use) runs at half the FP16-accumulate rate; FP8 uncertain",
       nvml=("NVIDIA GeForce RTX 4090",), link=PCIE),
    _p("mi300x", "AMD Instinct MI300X 192GB", bf16=1307.4, fp8=2614.9, int8=2614.9, tf32=None,
       bw_tb=5.3, mem_gb=192, source="AMD MI300X spec page (dense); not NVML: pass --gpu mi300x",
       nvml=(), link=INFINITY_FABRIC3),
    _p("mi325x", "AMD Instinct MI325X 256GB", bf16=1307.4, fp8=2614.9, int8=2614.9, tf32=None,
       bw_tb=6.0, mem_gb=256, source="AMD MI325X spec page (dense); not NVML: pass --gpu mi325x",
       nvml=(), link=INFINITY_FABRIC3),
    _p("mi355x", "AMD Instinct MI355X 288GB", bf16=2516.6, fp8=5033.2, int8=5033.2, tf32=None,
       bw_tb=8.0, mem_gb=288, source="AMD MI355X spec page (dense: 256 CUs at 2.4 GHz, 4,096 16-bit and "
       "8,192 FP8/INT8 FLOP a CU and clock); not NVML: pass --gpu mi355x", nvml=(), link=INFINITY_FABRIC4),
)

PROFILES: Mapping[str, GpuProfile] = MappingProxyType({p.key: p for p in _ALL})

# Short spellings people type; each resolves to one profile key.
ALIASES: Mapping[str, str] = MappingProxyType({
    "h100": "h100-sxm", "h100-sxm5": "h100-sxm", "h200-sxm": "h200", "a100": "a100-sxm-80gb",
    "a100-80gb": "a100-sxm-80gb", "a100-40gb": "a100-sxm-40gb", "a100-sxm": "a100-sxm-80gb",
    "a100-pcie": "a100-pcie-80gb", "rtx6000-ada": "rtx-6000-ada", "4090": "rtx-4090",
})

UNKNOWN_GPU = "unknown"  # the profile key reported for a GPU with no constants on file

# GPUs that NVML names but whose dense figures are not public or not settled: no profile, a reason.
_UNSURE: tuple[tuple[str, str], ...] = (
    ("A10G", "NVIDIA publishes no tensor-core figures for the A10G (it is not the A10's 125 TFLOP/s)"),
    ("H20 3E", "the H20-3e's figures are not public"),
    ("B100", "the B100's dense figures are only derived from HGX totals"),
)


@dataclass(frozen=True)
class GpuMatch:
    """An NVML device name matched to a profile, or to none with the reason MBU/MFU stay absent."""

    name: str
    profile: GpuProfile | None
    reason: str = ""  # empty when a profile matched

    @property
    def key(self) -> str:
        """The profile key, or 'unknown' (the `profile` label of rooflight_gpu_info)."""
        return self.profile.key if self.profile else UNKNOWN_GPU


def get_profile(key: str) -> GpuProfile:
    """The profile for `key` (or an alias such as `h100`); ConfigError listing valid keys otherwise."""
    k = key.strip().lower()
    k = ALIASES.get(k, k)
    if k not in PROFILES:
        raise ConfigError(f"unknown GPU profile {key!r}; valid: {', '.join(sorted(PROFILES))}")
    return PROFILES[k]


def _norm(name: str) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'A100 SXM4 80GB' (older drivers omit the 'NVIDIA ' prefix)."""
    s = re.sub(r"[-_\s]+", " ", name.strip().upper())
    return re.sub(r"^(NVIDIA|TESLA) ", "", s).strip()


def _has(s: str, token: str) -> bool:
    return re.search(rf"(^| ){re.escape(token)}( |$)", s) is not None


def match_nvml_name(name: str, memory_total_bytes: float | None = None) -> GpuMatch:
    """The profile for an NVML device name, or an unknown match with its reason.

    `memory_total_bytes` (NVML's total, e.g. 81,559 MiB on an H100 80GB) disambiguates names that do
    not carry the memory size. Unsure variants (A10G, H20-3e, B100) and GPUs with no profile (H800,
    A800, RTX PRO 6000, ...) are unknown: the caller leaves MBU and MFU absent and says why.
    """
    profile = _lookup(_norm(name), memory_total_bytes)
    if profile is not None:
        return GpuMatch(name, profile)
    return GpuMatch(name, None, unknown_gpu_reason(name))


def unknown_gpu_reason(name: str) -> str:
    """Why a GPU has no constants, and what to do about it (for the log and rooflight_gpu_info)."""
    s = _norm(name)
    why = next((text for token, text in _UNSURE if token in s), f"no dense peaks on file for {name!r}")
    return (f"{why}: MBU and MFU are left absent rather than divided by another GPU's peaks; pass "
            f"--gpu with one of {', '.join(sorted(PROFILES))} if its figures match")


def _lookup(s: str, memory_total_bytes: float | None) -> GpuProfile | None:
    if any(token in s for token, _ in _UNSURE):
        return None
    big = memory_total_bytes is not None and memory_total_bytes > 60e9
    if "GH200" in s:
        return PROFILES["gh200-144gb" if ("144G" in s or "HBM3E" in s) else "gh200"]
    if "GB200" in s:
        return PROFILES["gb200"]
    if "GB300" in s:
        return PROFILES["gb300"]
    if _has(s, "B300"):
        return PROFILES["b300"]
    if "RTX 6000 ADA" in s:
        return PROFILES["rtx-6000-ada"]
    if _has(s, "RTX") and _has(s, "4090"):
        return PROFILES["rtx-4090"]
    if _has(s, "B200"):
        return PROFILES["b200"]
    if _has(s, "H200"):
        return PROFILES["h200-nvl" if _has(s, "NVL") else "h200"]
    if _has(s, "H20"):
        return PROFILES["h20"]
    if _has(s, "H100"):
        if _has(s, "NVL"):
            return PROFILES["h100-nvl"]
        if _has(s, "PCIE"):
            return PROFILES["h100-pcie"]
        if memory_total_bytes is not None and memory_total_bytes > 90e9:
            return PROFILES["h100-nvl"]
        return PROFILES["h100-sxm"]
    if _has(s, "A100"):
        form = "pcie" if _has(s, "PCIE") else "sxm"
        if "80GB" in s:
            size = "80gb"
        elif "40GB" in s:
            size = "40gb"
        else:
            size = "80gb" if big or memory_total_bytes is None else "40gb"
        return PROFILES[f"a100-{form}-{size}"]
    for token, key in (("L40S", "l40s"), ("L40", "l40"), ("L4", "l4"), ("A10", "a10")):
        if _has(s, token):
            return PROFILES[key]
    return None
