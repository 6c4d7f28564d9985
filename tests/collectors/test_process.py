"""ProcessCollector against real processes: a parent that forks a child and listens on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ports import free_port
from rooflight.collectors import process
from rooflight.collectors.errors import SourceError
from rooflight.collectors.process import NeedsSearch, ProcessCollector, ProcessTable, find_listener

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


@pytest.fixture(autouse=True, params=["proc-stat", "psutil"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test with each way of reading a process's counters: /proc/<pid>/stat on Linux, psutil elsewhere."""
    read = {"proc-stat": process._counters_from_stat, "psutil": process._counters_from_psutil}[request.param]
    monkeypatch.setattr(process, "read_counters", read)
    return str(request.param)


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


def test_without_search_an_unknown_listener_is_left_to_a_search(engine) -> None:
    """read(search=False) never scans for the port's listener (the agent's one loop must not wait on it):
    it says a search is needed until one found the process, then reads it; a PID is never searched for."""
    port, proc, _ = engine
    by_port = ProcessCollector(port=port)
    with pytest.raises(NeedsSearch):
        by_port.read(search=False)
    assert by_port.read().pid == proc.pid  # the search
    assert by_port.read(search=False).pid == proc.pid
    assert ProcessCollector(proc.pid).read(search=False).pid == proc.pid
    proc.kill()
    proc.wait(5)
    with pytest.raises(NeedsSearch):  # the process it knew is gone: a search again, not a read of the stale one
        by_port.read(search=False)


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


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def sleeper() -> subprocess.Popen[bytes]:
    """A child of this test process that waits to be killed."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def reap(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        p.kill()
        p.wait(5)


def own_table() -> ProcessTable:
    """A table no other collector shares, read again at every rescan."""
    return ProcessTable(share_s=0.0)


async def test_the_tree_is_read_again_only_every_rescan_interval(engine) -> None:
    _, proc, child = engine
    clock, table = Clock(), own_table()
    c = ProcessCollector(proc.pid, monotonic=clock, rescan_s=10.0, table=table)
    for _ in range(5):
        s = await c.sample()
        assert set(c.tree_pids) == {proc.pid, child} and s.rss_bytes > 32 << 20
        clock.t += 1.9
    assert table.scans == 1  # five samples within 10 s: one scan of /proc
    clock.t += 1.0
    await c.sample()
    assert table.scans == 2


async def test_collectors_rescanning_together_read_proc_once(engine) -> None:
    _, proc, child = engine
    clock, table = Clock(), ProcessTable(share_s=60.0)
    collectors = [ProcessCollector(proc.pid, monotonic=clock, rescan_s=10.0, table=table) for _ in range(8)]
    for c in collectors:
        await c.sample()  # a first look reads /proc itself: never a table older than the collector
    assert table.scans == 8
    clock.t += 10.0
    for c in collectors:
        await c.sample()  # the periodic rescan: the first one's read serves them all
        assert set(c.tree_pids) == {proc.pid, child}
    assert table.scans == 9


async def test_a_shared_table_is_not_lent_to_a_collector_looking_for_the_first_time() -> None:
    table = ProcessTable(share_s=60.0)
    await ProcessCollector(os.getpid(), table=table).sample()
    late = sleeper()
    try:
        c = ProcessCollector(os.getpid(), table=table)
        await c.sample()
        assert late.pid in c.tree_pids
    finally:
        reap(late)


async def test_a_child_started_later_is_counted_from_the_next_rescan() -> None:
    clock = Clock()
    c = ProcessCollector(os.getpid(), monotonic=clock, rescan_s=10.0, table=own_table())
    await c.sample()
    late = sleeper()
    try:
        await c.sample()
        assert late.pid not in c.tree_pids  # not yet: the tree is as read 0 s ago
        clock.t += 10.0
        await c.sample()
        assert late.pid in c.tree_pids
    finally:
        reap(late)


async def test_a_child_that_exits_makes_the_next_sample_read_the_tree_again() -> None:
    clock = Clock()
    first, second = sleeper(), None
    try:
        c = ProcessCollector(os.getpid(), monotonic=clock, rescan_s=10.0, table=own_table())
        await c.sample()
        assert first.pid in c.tree_pids
        reap(first)
        second = sleeper()
        await c.sample()  # the exited child is left out, and noticed
        assert first.pid not in c.tree_pids
        await c.sample()  # no time passed, but the tree changed: read again
        assert second.pid in c.tree_pids
    finally:
        reap(first, *([second] if second else []))


async def test_an_orphaned_grandchild_leaves_the_tree_at_once() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
         "print(g.pid, flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None and parent.stdin is not None
    grandchild = int(parent.stdout.readline())
    try:
        clock = Clock()
        c = ProcessCollector(os.getpid(), monotonic=clock, rescan_s=10.0, table=own_table())
        await c.sample()
        assert {parent.pid, grandchild} <= set(c.tree_pids)
        parent.stdin.close()  # the parent exits; its child is re-parented away from this tree
        parent.wait(5)
        await c.sample()
        assert parent.pid not in c.tree_pids and grandchild not in c.tree_pids
    finally:
        import psutil
        parent.kill()
        try:
            psutil.Process(grandchild).kill()
        except psutil.NoSuchProcess:
            pass


ODD_NAME = r"""
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, b"a) (b c) ", 0, 0, 0)  # PR_SET_NAME: a name that looks like stat's own fields
x = bytearray(16 << 20)
t = time.process_time()
while time.process_time() - t < 0.1: pass
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("reader", ["proc-stat"], indirect=True)
def test_one_read_of_proc_stat_gives_psutils_numbers(reader: str) -> None:
    """The counters from /proc/<pid>/stat alone equal psutil's from its four files, for a process whose name
    (in parentheses in that file) holds parentheses and spaces."""
    import psutil
    child = subprocess.Popen([sys.executable, "-c", ODD_NAME], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        p = psutil.Process(child.pid)
        assert p.name() == "a) (b c) "
        ours = process._counters_from_stat(child.pid)
        with p.oneshot():
            times = p.cpu_times()
            theirs = process.Counters(ppid=p.ppid(), started=0.0, cpu_seconds=times.user + times.system,
                                      rss_bytes=p.memory_info().rss, threads=p.num_threads())
        assert ours.ppid == theirs.ppid == os.getpid()
        assert ours.threads == theirs.threads
        assert ours.cpu_seconds == pytest.approx(theirs.cpu_seconds, abs=0.02) and ours.cpu_seconds >= 0.09
        assert ours.rss_bytes == theirs.rss_bytes and ours.rss_bytes > 16 << 20  # statm, as psutil reads it
        assert process._counters_from_stat(child.pid).started == ours.started  # the same process, the same start
        assert process._counters_from_stat(os.getpid()).started != ours.started
    finally:
        child.kill()
        child.wait(5)
    with pytest.raises(psutil.NoSuchProcess):
        process._counters_from_stat(child.pid)


GROWER = r"""
import mmap, sys
held = []
print("ready", flush=True)
for _ in sys.stdin:  # each line: map and touch 64 MiB more (the address space grows, the process stays)
    m = mmap.mmap(-1, 64 << 20); m.write(b"x" * (64 << 20)); held.append(m)
    print("grown", flush=True)
"""


async def test_a_root_whose_memory_grows_is_still_the_same_process() -> None:
    """The start time that tells a reused PID is the process's start, not a field that moves as it runs
    (the next field in /proc/<pid>/stat is its address-space size)."""
    import psutil
    proc = subprocess.Popen([sys.executable, "-c", GROWER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        c = ProcessCollector(proc.pid, table=own_table())
        before = await c.sample()
        proc.stdin.write("grow\n"); proc.stdin.flush()
        assert proc.stdout.readline().strip() == "grown"
        after = await c.sample()  # not "PID now belongs to another process"
        assert after.pid == proc.pid and after.rss_bytes > before.rss_bytes + (32 << 20)
        started = process.read_counters(proc.pid).started
        if isinstance(started, int):  # /proc/<pid>/stat: clock ticks since boot, psutil's create_time's source
            since_boot = started / os.sysconf("SC_CLK_TCK")
            assert since_boot + psutil.boot_time() == pytest.approx(psutil.Process(proc.pid).create_time(), abs=0.05)
    finally:
        proc.kill()
        proc.wait(5)


def zombie(proc: subprocess.Popen[str]) -> None:
    """Kill `proc`, a child of this test process, and leave it unreaped: a zombie until wait()."""
    import psutil
    proc.kill()
    p = psutil.Process(proc.pid)
    while p.status() != psutil.STATUS_ZOMBIE:  # a state to reach, not a time to wait
        pass


async def test_a_zombie_engine_is_gone() -> None:
    """An engine that exited but is not reaped yet keeps its PID and start time, but no memory, no threads
    and no socket: by PID it is gone; by port the engine listening now is followed, not the zombie."""
    port = free_port()
    first, child = start_engine(port)
    second = None
    try:
        by_port = ProcessCollector(port=port, table=own_table())
        by_pid = ProcessCollector(first.pid, table=own_table())
        assert (await by_port.sample()).pid == (await by_pid.sample()).pid == first.pid
        zombie(first)
        with pytest.raises(SourceError):
            await by_pid.sample()
        second, child2 = start_engine(port)
        assert (await by_port.sample()).pid == second.pid
        stop(second, child2)
    finally:
        stop(first, child)
        if second is not None:
            second.wait(5)


async def test_a_zombie_child_is_left_out_without_reading_the_tree_every_sample() -> None:
    clock = Clock()
    table = own_table()
    child = sleeper()
    try:
        c = ProcessCollector(os.getpid(), monotonic=clock, rescan_s=10.0, table=table)
        await c.sample()
        assert child.pid in c.tree_pids
        zombie(child)  # type: ignore[arg-type]
        for _ in range(4):
            await c.sample()
            assert child.pid not in c.tree_pids
        assert table.scans <= 2  # the first read, and at most one more: not one a sample
    finally:
        reap(child)


THREAD_LEADER_EXITS = r"""
import ctypes, threading, time
def run():
    x = bytearray(16 << 20)
    print("ready", flush=True)
    time.sleep(60)
threading.Thread(target=run).start()
time.sleep(0.2)
ctypes.CDLL(None).pthread_exit(None)  # the main thread ends; the process lives on in its other thread
"""


async def test_a_process_whose_main_thread_exited_is_still_running() -> None:
    """/proc shows its first thread as a zombie, but it has a thread left: not gone."""
    import psutil
    proc = subprocess.Popen([sys.executable, "-c", THREAD_LEADER_EXITS], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        p = psutil.Process(proc.pid)
        while p.status() != psutil.STATUS_ZOMBIE:
            pass
        assert (await ProcessCollector(proc.pid, table=own_table()).sample()).num_threads >= 1
    finally:
        proc.kill()
        proc.wait(5)


async def test_a_process_elsewhere_that_may_not_be_read_does_not_fail_the_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc mounted hidepid=1 (another user's /proc/<pid>/stat: permission denied), simulated for PID 1,
    which is not in this tree: the tree is still read."""
    import psutil._pslinux as linux
    real = linux.open_binary

    def denied_for_pid_1(path: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        if path.endswith("/1/stat"):
            raise PermissionError(13, "Permission denied", path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(linux, "open_binary", denied_for_pid_1)
    child = sleeper()
    try:
        c = ProcessCollector(os.getpid(), table=own_table())
        await c.sample()
        assert child.pid in c.tree_pids
    finally:
        reap(child)


async def test_a_given_pid_that_now_names_another_process_is_a_source_error(monkeypatch) -> None:
    """A target given by PID is that process: once its PID names a process started at another time (the
    engine exited and the PID was reused), the source fails rather than follow the stranger."""
    c = ProcessCollector(os.getpid(), table=own_table())
    await c.sample()
    read = process.read_counters
    monkeypatch.setattr(process, "read_counters", lambda pid: read(pid)._replace(started=read(pid).started + 1))
    with pytest.raises(SourceError, match="now belongs to another process"):
        await c.sample()
