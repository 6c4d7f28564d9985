"""ProcessCollector against real processes: a parent that forks a child and listens on 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from rooflight.collectors.errors import SourceError
from rooflight.collectors.process import ProcessCollector, find_listener

ENGINE = r"""
import socket, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(32 << 20); time.sleep(60)"])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
t = time.process_time()
while time.process_time() - t < 0.2: pass   # burn a little CPU so the counter moves
print("ready", child.pid, flush=True)
time.sleep(60)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_engine(port: int) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", ENGINE, str(port)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split() if proc.stdout else []
    assert line and line[0] == "ready", line
    return proc, int(line[1])


def stop(proc: subprocess.Popen[str], child: int) -> None:
    import psutil
    for p in (proc.pid, child):
        try:
            psutil.Process(p).kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(5)
    if proc.stdout:
        proc.stdout.close()


@pytest.fixture
def engine():
    port = free_port()
    proc, child = start_engine(port)
    yield port, proc, child
    stop(proc, child)


async def test_by_pid_sums_the_tree(engine) -> None:
    _, proc, child = engine
    c = ProcessCollector(proc.pid, clock=lambda: 123.0)
    s = await c.sample()
    assert s.pid == proc.pid and s.timestamp == 123.0
    assert set(c.tree_pids) == {proc.pid, child}
    assert s.rss_bytes > 32 << 20  # the child's 32 MiB buffer is counted
    assert s.cpu_seconds_total >= 0.2
    assert s.num_threads >= 2
    assert s.gpu_pids == ()


async def test_by_port_finds_the_listener(engine) -> None:
    port, proc, _ = engine
    assert find_listener(port) == proc.pid
    s = await ProcessCollector(port=port).sample()
    assert s.pid == proc.pid


async def test_gpu_pids_are_the_tree_pids_nvml_reports(engine) -> None:
    _, proc, child = engine
    c = ProcessCollector(proc.pid, gpu_pids_of=lambda: {child, 999_999_999})
    assert (await c.sample()).gpu_pids == (child,)


async def test_port_follows_a_restart() -> None:
    port = free_port()
    first, child = start_engine(port)
    c = ProcessCollector(port=port)
    try:
        assert (await c.sample()).pid == first.pid
    finally:
        stop(first, child)
    with pytest.raises(SourceError) as err:
        await c.sample()
    assert err.value.reason == "process"
    second, child2 = start_engine(port)
    try:
        assert (await c.sample()).pid == second.pid
    finally:
        stop(second, child2)


async def test_exited_pid_is_a_source_error(engine) -> None:
    _, proc, child = engine
    c = ProcessCollector(proc.pid)
    await c.sample()
    stop(proc, child)
    with pytest.raises(SourceError) as err:
        await c.sample()
    assert err.value.reason == "process"


async def test_unknown_pid_and_port() -> None:
    with pytest.raises(SourceError):
        await ProcessCollector(2**22 + 12345).sample()
    with pytest.raises(SourceError):
        await ProcessCollector(port=free_port()).sample()


def test_needs_exactly_one_of_pid_and_port() -> None:
    with pytest.raises(ValueError):
        ProcessCollector()
    with pytest.raises(ValueError):
        ProcessCollector(1, port=2)
