"""bench/gpu_check.py without a GPU: a clear "no GPU" line and exit 0; its printout on fake readings."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import gpu_check  # noqa: E402

from rooflight.collectors.samples import GpuDevice  # noqa: E402


def test_runs_to_a_no_gpu_message_here() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--nvtx-bench"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "no GPU" in out.stdout and "nothing was checked" in out.stdout
    assert "ns/call" in out.stdout


def test_summary_puts_gpm_next_to_the_computed_rate(capsys: pytest.CaptureFixture[str]) -> None:
    seen = [GpuDevice(0, "GPU-x", "NVIDIA H200", kernel_residency_ratio=1.0, dram_bandwidth_utilization_ratio=0.8,
                      extra={"sm_active_ratio": 0.5, "power_watts": 600.0})] * 3
    gpu_check.summarize("copy loop", seen, "3800 GB/s", 4.8e12, 989e12, 3.8e12, "bytes")
    text = capsys.readouterr().out
    assert "GPM DRAM bandwidth util: 80.0%" in text
    assert "GPM x peak: 3840 GB/s" in text and "computed: 3800 GB/s" in text
    assert "'GPU util'): 100.0%" in text and "SM active: 50.0%" in text
