"""The process collector: CPU time, RSS and threads of the engine's process tree, as psutil sees it.

The engine is found by PID, or by the TCP port it listens on (psutil.net_connections), and found
again when it restarts on the same port. vLLM runs an API server, an engine-core process and one
worker per GPU, so every number is summed over the whole tree (the process and all descendants):
- cpu_seconds_total is user + system time of the processes alive now. A child that exits takes its
  time with it, so the sum can fall: the windows treat that as a counter reset.
- rss_bytes counts shared pages once per process (psutil's RSS), so it over-states a tree that
  shares memory; it is the number `ps` and the OOM killer's accounting start from.
Who is in the tree is read again every TREE_RESCAN_S seconds, and at the next sample after one of its
processes exited: finding a process's children means reading /proc/<pid>/stat of every process on the
machine (about 1 ms per 80 processes, tens of ms on a node with thousands), where reading the tree's
own counters is two small files per process (stat and statm, read directly where there is a /proc:
_counters_from_stat). A worker the engine starts later is counted from the next rescan on, with the CPU
time it used so far. That read is shared (ProcessTable): collectors that rescan within SCAN_SHARE_S of
each other, one per target, all ticking together, read /proc once.
The reads run off the event loop (the agent's worker thread); a vanished engine is SourceError("process"),
and so is one that exited but is not yet reaped (a zombie).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Callable, Collection, Mapping, NamedTuple, Protocol, Sequence

import psutil

from rooflight.collectors.errors import SourceError
from rooflight.collectors.samples import ProcessSample

TREE_RESCAN_S = 10.0  # how often the tree's membership is read again from the whole of /proc
SCAN_SHARE_S = 1.0  # a read of /proc this recent serves every collector (their loops tick together)


class ProcessTable:
    """Parent PID -> child PIDs of every process on the machine, read from /proc at most once per
    `share_s` for the collectors that rescan together: an agent watching eight engines reads it once
    per rescan, not eight times.

    A read is lent only to a collector that read the table before it, for its periodic rescan: a
    collector's first look, or its look after a process of its tree exited, reads /proc itself, so it
    never sees a table older than what it is looking for."""

    def __init__(self, share_s: float = SCAN_SHARE_S, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._share_s = share_s
        self._monotonic = monotonic
        self._lock = threading.Lock()  # collectors read it from worker threads
        self._read_at: float | None = None
        self._children: Mapping[int, Sequence[int]] = {}
        self.scans = 0  # reads of the whole of /proc

    def descendants(self, root: psutil.Process, after: float | None) -> tuple[list[psutil.Process], float]:
        """Every descendant of `root`, from a read made after `after` (the caller's previous one; None:
        never, or no longer valid) and within share_s, else from a new read; and when that read was made."""
        with self._lock:
            now, read_at = self._monotonic(), self._read_at
            lend = read_at is not None and after is not None and after < read_at and now - read_at < self._share_s
            if read_at is None or not lend:
                read_at = self._read_at = now
                self._children = _read_children()
                self.scans += 1
            children = self._children
        return _descendants(root, children), read_at


def _read_children() -> dict[int, list[int]]:
    """Parent PID -> child PIDs, every process included (a leaf maps to no children)."""
    read = getattr(psutil, "_ppid_map", None)  # what Process.children reads; ~3x faster than process_iter
    try:
        ppids = read() if read is not None else None
    except psutil.AccessDenied:  # some process's stat is not ours to read (/proc mounted hidepid=1)
        ppids = None
    if ppids is None:  # one process at a time: one we may not read has no parent here (None)
        ppids = {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"])}
    out: dict[int, list[int]] = {pid: [] for pid in ppids}
    for pid, ppid in ppids.items():
        if ppid is not None and ppid != pid:
            out.setdefault(ppid, []).append(pid)
    return out


def _descendants(root: psutil.Process, children: Mapping[int, Sequence[int]]) -> list[psutil.Process]:
    """The processes below `root` in `children`; as psutil's children(), one younger than its parent
    is a reused PID, not a child."""
    out: list[psutil.Process] = []
    todo, seen = [root], {root.pid}
    while todo:
        parent = todo.pop()
        for pid in children.get(parent.pid, ()):
            if pid in seen:
                continue
            seen.add(pid)
            try:
                child = psutil.Process(pid)
                if child.create_time() < parent.create_time():
                    continue
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
            out.append(child)
            todo.append(child)
    return out


SHARED_TABLE = ProcessTable()  # what collectors share unless given their own


class Counters(NamedTuple):
    """One process's counters at one read, and what tells its PID's reuse."""

    ppid: int
    started: float  # when the process started, in the reader's own unit: a new value is another process
    cpu_seconds: float  # user + system
    rss_bytes: int
    threads: int


_PROC_STAT = os.path.exists("/proc/self/stat")
_TICKS_S = os.sysconf("SC_CLK_TCK") if _PROC_STAT else 100
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if _PROC_STAT else 4096


def _counters_from_stat(pid: int) -> Counters:
    """The counters from /proc/<pid>/stat and statm (proc(5)): the numbers psutil's cpu_times, memory_info,
    num_threads, ppid and create_time give, in two reads where psutil takes four (stat, statm, status, and
    stat again to rule out a reused PID). Why by hand (measured, 64 trees of 3 processes read in a loop,
    time.process_time, two runs each): 13.0-16.4 ms a tick through psutil, 4.6-5.9 ms this way; the agent
    does it every second for every target. RSS is statm's, as psutil's: stat's own RSS field is a per-CPU
    approximation that on a node with many cores can be off by hundreds of MiB."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        with open(f"/proc/{pid}/statm", "rb") as f:
            resident_pages = int(f.read().split()[1])
    except (FileNotFoundError, ProcessLookupError):
        raise psutil.NoSuchProcess(pid) from None
    except PermissionError:
        raise psutil.AccessDenied(pid) from None
    except (IndexError, ValueError):
        raise psutil.NoSuchProcess(pid) from None  # an exiting process's statm can read empty
    fields = data[data.rfind(b")") + 2 :].split()  # the name, in parentheses, may hold spaces and parentheses
    if len(fields) < 22:
        raise psutil.NoSuchProcess(pid)  # an exiting process's stat can read short
    threads = int(fields[17])
    if fields[0] in (b"Z", b"X") and threads <= 1:  # exited, not reaped; Z with threads left: only its first ended
        raise psutil.ZombieProcess(pid)
    return Counters(ppid=int(fields[1]), started=int(fields[19]),
                    cpu_seconds=(int(fields[11]) + int(fields[12])) / _TICKS_S,
                    rss_bytes=resident_pages * _PAGE_BYTES, threads=threads)


def _counters_from_psutil(pid: int) -> Counters:
    """The counters where there is no /proc (not Linux): psutil's calls, one process object a read."""
    proc = psutil.Process(pid)
    with proc.oneshot():
        times, threads = proc.cpu_times(), proc.num_threads()
        if threads <= 1 and proc.status() == psutil.STATUS_ZOMBIE:  # exited, not reaped: gone, as above
            raise psutil.ZombieProcess(pid)
        return Counters(ppid=proc.ppid(), started=proc.create_time(), cpu_seconds=times.user + times.system,
                        rss_bytes=proc.memory_info().rss, threads=threads)


read_counters: Callable[[int], Counters] = _counters_from_stat if _PROC_STAT else _counters_from_psutil


def find_listener(port: int) -> int | None:
    """The PID listening on TCP `port` (any address), or None. Falls back to a per-process scan
    when the system-wide table is not readable (other users' sockets without privileges)."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return int(conn.pid)
    except psutil.AccessDenied:
        pass
    for proc in psutil.process_iter():
        try:
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                    return proc.pid
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return None


class NeedsSearch(Exception):
    """The engine's process is not known (yet, or any more): it must be looked for by the port it listens on."""

    def __init__(self, port: int | None) -> None:
        super().__init__(f"the process listening on TCP port {port} must be looked for")


class ProcessSource(Protocol):
    """What the sampler reads an engine's process tree through: ProcessCollector, or a test's stand-in."""

    tree_pids: tuple[int, ...]  # the tree's PIDs at the last sample, matched against the GPUs' processes

    async def sample(self) -> ProcessSample: ...  # raises SourceError when the process is gone


class ProcessCollector:
    """Samples the engine's process tree. `gpu_pids_of` (optional) returns the PIDs NVML sees on the
    GPUs; the sample's gpu_pids are the tree's PIDs among them."""

    def __init__(self, pid: int | None = None, *, port: int | None = None,
                 clock: Callable[[], float] = time.time,
                 gpu_pids_of: Callable[[], Collection[int]] | None = None,
                 monotonic: Callable[[], float] = time.monotonic, rescan_s: float = TREE_RESCAN_S,
                 table: ProcessTable | None = None) -> None:
        if (pid is None) == (port is None):
            raise ValueError("give exactly one of pid or port")
        self._pid = pid
        self._port = port
        self._clock = clock
        self._gpu_pids_of = gpu_pids_of
        self._monotonic = monotonic
        self._rescan_s = rescan_s
        self._table = table or SHARED_TABLE
        self._proc: psutil.Process | None = None
        self._root_started: float | None = None  # start time of the root as last read (with `pid`: the first)
        self._child_started: dict[int, float] = {}  # start time of each child since the tree was last read
        self._tree: list[psutil.Process] = []  # the root first, then its descendants when last read
        self._tree_read_at: float | None = None  # None: read the tree again at the next sample
        self._table_read_at: float | None = None  # when the table read last was made (the table's clock)
        self.tree_pids: tuple[int, ...] = ()

    async def sample(self) -> ProcessSample:
        return await asyncio.to_thread(self.read)

    def _root(self, search: bool) -> tuple[psutil.Process, Counters]:
        """The engine's process and its counters, read now: the one of the last sample while its PID is still
        that process (the start time tells a reused PID), else looked for again."""
        if self._proc is not None:
            try:
                now = read_counters(self._proc.pid)
                if now.started == self._root_started:
                    return self._proc, now
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                pass
            except psutil.AccessDenied as exc:
                raise SourceError("process", f"cannot read process {self._proc.pid}: {exc}") from None
            self._proc = None  # it exited, or its PID now names another process
        if self._pid is None and not search:
            raise NeedsSearch(self._port)
        pid = self._pid if self._pid is not None else find_listener(self._port or 0)
        if pid is None:
            raise SourceError("process", f"no process listens on TCP port {self._port}")
        try:
            proc, now = psutil.Process(pid), read_counters(pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            raise SourceError("process", f"no process with PID {pid}") from None
        except psutil.AccessDenied as exc:
            raise SourceError("process", f"cannot read process {pid}: {exc}") from None
        if self._pid is not None and self._root_started is not None and now.started != self._root_started:
            raise SourceError("process", f"PID {pid} now belongs to another process")
        self._proc, self._root_started = proc, now.started
        return proc, now

    def _members(self, root: psutil.Process) -> list[psutil.Process]:
        """The tree as last read, or read again: when it is TREE_RESCAN_S old, has a new root or lost a process."""
        now = self._monotonic()
        read_at = self._tree_read_at
        if self._tree and self._tree[0] is root and read_at is not None and now - read_at < self._rescan_s:
            return self._tree
        after = self._table_read_at if self._tree and self._tree[0] is root and read_at is not None else None
        below, self._table_read_at = self._table.descendants(root, after)
        self._tree, self._tree_read_at = [root, *below], now
        self._child_started = {}
        return self._tree

    def read(self, *, search: bool = True) -> ProcessSample:
        """The sample, read here and now (blocking: /proc reads; the agent calls it in a worker thread).

        `search=False`: NeedsSearch instead of looking for the process listening on the port, which reads
        every process's sockets (seconds on a busy node); the agent does that search in a thread of its own,
        so it never holds up the other targets' reads."""
        t = self._clock()
        root, counters = self._root(search)
        try:
            tree = self._members(root)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self._proc = None
            raise SourceError("process", f"engine process {root.pid} exited") from None
        except psutil.AccessDenied as exc:
            raise SourceError("process", f"cannot read process {root.pid}: {exc}") from None
        cpu, rss, threads = counters.cpu_seconds, counters.rss_bytes, counters.threads
        pids = [root.pid]
        members = {proc.pid for proc in tree}
        for proc in tree[1:]:
            try:
                child = read_counters(proc.pid)
            except psutil.ZombieProcess:
                continue  # exited; its PID stays until its parent reaps it, so reading the tree again would not help
            except psutil.NoSuchProcess:
                self._tree_read_at = None  # the tree changed: read who is in it at the next sample
                continue
            except psutil.AccessDenied:
                continue  # a child we may not read: leave it out rather than fail the tree
            if child.ppid not in members or self._child_started.setdefault(proc.pid, child.started) != child.started:
                self._tree_read_at = None  # re-parented, or its PID reused
                continue
            cpu += child.cpu_seconds
            rss += child.rss_bytes
            threads += child.threads
            pids.append(proc.pid)
        self.tree_pids = tuple(pids)
        on_gpu: tuple[int, ...] = ()
        if self._gpu_pids_of is not None:
            seen = set(self._gpu_pids_of())
            on_gpu = tuple(p for p in pids if p in seen)
        return ProcessSample(timestamp=t, pid=root.pid, cpu_seconds_total=cpu, rss_bytes=rss,
                             num_threads=threads, gpu_pids=on_gpu)
