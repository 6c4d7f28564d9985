"""NVTX marks and ranges for notable agent events, free when no profiler is attached.

When the agent detects something worth seeing on an Nsight Systems timeline (head-of-line
blocking starts, a preemption burst, a GPU lost), it calls `mark(...)`, or wraps a stretch in
`range_(...)`, so the event lines up with the engine's kernels. NVTX only does work when a tool
has injected itself, which Nsight Systems does through NVTX_INJECTION64_PATH in the profiled
process's environment; without it both calls return after one attribute check
(bench/gpu_check.py --nvtx-bench prints the ns/call). `set_enabled` overrides the detection.
Nothing here may raise into the agent: a broken nvtx install means no marks.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

_nvtx: Any = None
_enabled = False


def _detect() -> bool:
    return bool(os.environ.get("NVTX_INJECTION64_PATH") or os.environ.get("NVTX_INJECTION32_PATH"))


def set_enabled(enabled: bool | None = None) -> bool:
    """Turn marks on or off (None: on exactly when a profiler injected NVTX). Returns the new state."""
    global _nvtx, _enabled
    want = _detect() if enabled is None else enabled
    if want and _nvtx is None:
        try:
            import nvtx
            _nvtx = nvtx
        except Exception:  # no nvtx package: no marks
            want = False
    _enabled = want
    return _enabled


def enabled() -> bool:
    return _enabled


def mark(message: str, *, color: str = "red", domain: str = "rooflight") -> None:
    """An instant NVTX event on the timeline."""
    if not _enabled:
        return
    try:
        _nvtx.mark(message=message, color=color, domain=domain)
    except Exception:
        pass


@contextlib.contextmanager
def range_(message: str, *, color: str = "orange", domain: str = "rooflight") -> Iterator[None]:
    """An NVTX range covering the `with` block."""
    if not _enabled:
        yield
        return
    try:
        rng = _nvtx.start_range(message=message, color=color, domain=domain)
    except Exception:
        rng = None
    try:
        yield
    finally:
        if rng is not None:
            try:
                _nvtx.end_range(rng)
            except Exception:
                pass


set_enabled()
