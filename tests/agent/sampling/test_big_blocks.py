"""memory.map_big_blocks: blocks of 1 MiB and more are handed back to the OS when freed, whatever big block
was freed before them (glibc's own threshold follows the largest block freed, and keeps smaller ones after it)."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from rooflight.agent.sampling import memory

_FREED_AFTER_A_BIGGER_ONE = textwrap.dedent("""
    import sys, psutil
    from rooflight.agent.sampling.memory import map_big_blocks
    if sys.argv[1] == "mapped":
        map_big_blocks()
    rss = lambda: psutil.Process().memory_info().rss
    first = bytearray(8 << 20)
    del first[:]  # a first big page's 8 MiB, freed
    blocks = [bytearray(3 << 20) for _ in range(4)]  # the next pages' 12 MiB, written
    before = rss()
    del blocks
    print(before - rss())
""")


def _handed_back(how: str) -> int:
    done = subprocess.run([sys.executable, "-c", _FREED_AFTER_A_BIGGER_ONE, how], capture_output=True, text=True,
                          timeout=60, check=True)
    return int(done.stdout)


def test_big_blocks_freed_after_a_bigger_one_leave_the_process() -> None:
    assert _handed_back("mapped") >= 10 << 20  # of the 12 MiB freed
    if platform.libc_ver()[0] == "glibc":  # (musl maps every big block on its own anyway)
        assert _handed_back("default") < 4 << 20  # glibc's own threshold: kept in the heap (the control)


@pytest.mark.parametrize("env", [{}, {"MALLOC_MMAP_THRESHOLD_": "65536"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}])
def test_a_threshold_the_operator_set_is_left_as_set(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    calls: list[tuple[int, int]] = []
    for name in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(memory, "_libc", lambda name: lambda *args: calls.append(args) or 1)
    memory.map_big_blocks()
    assert calls == ([] if env else [(memory._M_MMAP_THRESHOLD, memory.BIG_BLOCK_BYTES)])
