"""The process collector: CPU time, RSS and threads of the engine's process tree, as psutil sees it.

The engine is found by PID, or by the TCP port it listens on (psutil.net_connections), and found
again when it restarts on the same port. vLLM runs an API server, an engine-core process and one
worker per GPU, so every number is summed over the whole tree (the process and all descendants):
- cpu_seconds_total is user + system time of the processes alive now. A child that exits takes its
  time with it, so the sum can fall: the windows treat that as a counter reset.
- rss_bytes counts shared pages once per process (psutil's RSS), so it over-states a tree that
  shares memory; it is the number `ps` and the OOM killer's accounting start from.
psutil runs off the event loop (asyncio.to_thread); a vanished engine is SourceError("process").
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Collection

import psutil

from rooflight.collectors.errors import SourceError
from rooflight.collectors.samples import ProcessSample


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


class ProcessCollector:
    """Samples the engine's process tree. `gpu_pids_of` (optional) returns the PIDs NVML sees on the
    GPUs; the sample's gpu_pids are the tree's PIDs among them."""

    def __init__(self, pid: int | None = None, *, port: int | None = None,
                 clock: Callable[[], float] = time.time,
                 gpu_pids_of: Callable[[], Collection[int]] | None = None) -> None:
        if (pid is None) == (port is None):
            raise ValueError("give exactly one of pid or port")
        self._pid = pid
        self._port = port
        self._clock = clock
        self._gpu_pids_of = gpu_pids_of
        self._proc: psutil.Process | None = None
        self._started: float | None = None  # create_time of the PID we were given
        self.tree_pids: tuple[int, ...] = ()

    async def sample(self) -> ProcessSample:
        return await asyncio.to_thread(self._sample_sync)

    def _resolve(self) -> psutil.Process:
        if self._proc is not None and self._proc.is_running():  # is_running also catches PID reuse
            return self._proc
        self._proc = None
        pid = self._pid if self._pid is not None else find_listener(self._port or 0)
        if pid is None:
            raise SourceError("process", f"no process listens on TCP port {self._port}")
        try:
            self._proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            raise SourceError("process", f"no process with PID {pid}") from None
        if self._pid is not None and self._started is None:
            self._started = self._proc.create_time()
        elif self._pid is not None and self._proc.create_time() != self._started:
            self._proc = None
            raise SourceError("process", f"PID {pid} now belongs to another process")
        return self._proc

    def _sample_sync(self) -> ProcessSample:
        t = self._clock()
        root = self._resolve()
        try:
            tree = [root, *root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self._proc = None
            raise SourceError("process", f"engine process {root.pid} exited") from None
        except psutil.AccessDenied as exc:
            raise SourceError("process", f"cannot read process {root.pid}: {exc}") from None
        cpu = rss = 0.0
        threads = 0
        pids: list[int] = []
        for proc in tree:
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    cpu += times.user + times.system
                    rss += proc.memory_info().rss
                    threads += proc.num_threads()
                pids.append(proc.pid)
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                if proc is root:
                    self._proc = None
                    raise SourceError("process", f"engine process {root.pid} exited") from None
            except psutil.AccessDenied:
                continue  # a child we may not read: leave it out rather than fail the tree
        self.tree_pids = tuple(pids)
        on_gpu: tuple[int, ...] = ()
        if self._gpu_pids_of is not None:
            seen = set(self._gpu_pids_of())
            on_gpu = tuple(p for p in pids if p in seen)
        return ProcessSample(timestamp=t, pid=root.pid, cpu_seconds_total=cpu, rss_bytes=rss,
                             num_threads=threads, gpu_pids=on_gpu)
