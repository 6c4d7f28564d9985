"""Memory tuning of a process that reads engine pages for months: where glibc keeps a big page's blocks.

A page of several MiB (its body, its text, a long line or label value) is read in blocks glibc would otherwise
keep on its heap once freed: `rooflight run` maps big blocks on their own (map_big_blocks), and the engine loop
hands a big page's freed heap back (give_back_freed_memory). Both are no-ops where the C library is not glibc.
Python's cycle collector is tuned apart (agent/sampling/gc_tuning.py).
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Callable


@functools.cache
def _libc(name: str) -> Callable[..., int] | None:
    try:
        return getattr(ctypes.CDLL(None), name)  # type: ignore[no-any-return]
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS; Windows has no CDLL(None)): nothing to call
        return None


_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
BIG_BLOCK_BYTES = 1 << 20


def map_big_blocks() -> None:
    """Give every block of BIG_BLOCK_BYTES or more (a big page's bytes, text, a long line or label value) a mapping
    of its own, unmapped when freed: RSS then follows what a page holds while it is read, not what glibc kept.

    glibc otherwise raises its mmap threshold to the largest block freed (up to 32 MiB), and from then on such
    blocks come from the heap; a fixed threshold stops that. Measured with tests/collectors/test_bounds.py's RSS
    test, seven 4 MiB pages of different shapes in turn: peak RSS 90-92 MB without, 79-84 with (six runs each).
    A vLLM page (~55 kB a rank) is far under it. Called once, by `rooflight run`; a threshold the operator set
    (MALLOC_MMAP_THRESHOLD_, or glibc.malloc.mmap_threshold in GLIBC_TUNABLES) is left as set."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "mmap_threshold" in os.environ.get("GLIBC_TUNABLES", ""):
        return
    mallopt = _libc("mallopt")
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, BIG_BLOCK_BYTES)


def give_back_freed_memory() -> None:
    """Hand the heap pages a big page's buffers freed back to the OS (glibc's malloc_trim).

    glibc raises its mmap threshold to the largest block freed, so after one big page the next one's
    body and text come from the heap and stay resident once freed: without this, RSS ratchets up to
    the sum of what different pages left behind rather than the largest of them (measured peak RSS:
    92-93 MB without, 85-88 MB with, seven 4 MiB pages of different shapes in turn). Under map_big_blocks the
    threshold holds, and what is left to hand back is the heap's blocks under it (a big page's lines, its samples).
    """
    trim = _libc("malloc_trim")
    if trim is not None:
        trim(0)
