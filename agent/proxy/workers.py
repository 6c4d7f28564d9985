"""`rooflight proxy --workers N`: N relay processes on one port, one /metrics with every request in it.

One Python process relays on one core. Here each worker process runs its own ProxyServer on the same
--listen address (SO_REUSEPORT: the kernel spreads new connections over the workers' sockets), and this
process serves /metrics. The merge is exact because nothing is merged after the fact: each worker sends
every finished request's record (the same RequestRecord its own stats would have observed) to this process,
which observes them all in one ClientStats; percentiles, goodput and histograms are those of one proxy that
saw every request. The port's own counters (in flight, refused, bad requests, accounting errors) are the
sums of the workers' latest values. Records and counters travel every FLUSH_SECONDS over a pipe per worker,
so /metrics lags the traffic by that much at most, on top of the usual refresh.

A worker that dies takes the proxy down (exit 1): its supervisor restarts the whole, rather than running on
with fewer cores than asked for. So does a worker that hangs (nothing from it for HANG_SECONDS, where it
sends every FLUSH_SECONDS): the kernel keeps handing it its share of new connections, which would wait
forever while /metrics showed its last counters as if nothing were wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import queue
import signal
import socket
import threading
import time
from collections import Counter
from multiprocessing.connection import Connection
from typing import Any

from rooflight.agent.errors import ConfigError
from rooflight.agent.proxy.config import ProxyConfig
from rooflight.agent.config.values import split_listen

log = logging.getLogger("rooflight.proxy")
FLUSH_SECONDS = 0.1  # how often a worker sends its finished requests and counters
MAX_WORKERS = 256
MAX_QUEUED = 600  # batches (60 s of them) a worker holds for a parent that has stopped reading its pipe
HANG_SECONDS = 30.0  # a worker that sends nothing for this long is taken for hung (its loop no longer turns)


def parse_workers(value: Any) -> int:
    """--workers: a whole number of processes, 1 (the default) to MAX_WORKERS."""
    if value is None:
        return 1
    try:
        n = int(str(value).strip())
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_WORKERS:
        raise ConfigError(f"--workers {value!r}: give a whole number of relay processes from 1 to {MAX_WORKERS}"
                          " (about one per core the proxy may use)")
    return n


# -- a worker (its own process) --------------------------------------------------------------------------------


def worker_main(config: ProxyConfig, pipe: Connection, log_level: int) -> None:
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s %(name)s[{os.getpid()}]: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_worker(config, pipe))


async def _worker(config: ProxyConfig, pipe: Connection) -> None:
    from rooflight.agent.proxy.server import ProxyServer

    records: list[Any] = []
    server = ProxyServer(config, reuse_port=True, on_record=records.append)
    try:
        await server.start(refresh_loop=False, serve_metrics=False)
    except OSError as exc:
        await server.stop()
        pipe.send(("error", exc.strerror or str(exc)))
        return
    pipe.send(("ready", os.getpid()))
    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_reader(pipe.fileno(), stop.set)  # the parent went away (its end closed)

    # The pipe is written by a thread of its own: a parent busy rendering /metrics never holds the relay up.
    outbox = Outbox(pipe)

    def flush() -> None:
        outbox.put(server.stats, records[:])
        records.clear()

    try:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), FLUSH_SECONDS)
            flush()
    finally:
        loop.remove_reader(pipe.fileno())
        await server.stop()
        flush()  # what ended while stopping
        await loop.run_in_executor(None, outbox.close, 5.0)


class Outbox:
    """A worker's batches for the parent, sent by a thread of their own, at most `limit` of them unsent: a
    parent that stops reading (hung, or stopped) must not grow every worker's memory with the traffic. Past
    the limit a batch's records are dropped and counted as accounting errors, which the next batch that goes
    carries, so /metrics says how many requests it is missing."""

    def __init__(self, pipe: Connection, limit: int = MAX_QUEUED) -> None:
        self.limit = limit
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._sender = threading.Thread(target=_send_all, args=(self._queue, pipe), name="rooflight-proxy-records",
                                        daemon=True)
        self._sender.start()

    def put(self, stats: Any, records: list[Any]) -> bool:
        """Queue `records` with the worker's counters; False (and the records counted lost) when full."""
        if self._queue.qsize() >= self.limit:
            stats.accounting_errors += len(records)
            return False
        counters = {"in_flight": stats.in_flight, "accounting_errors": stats.accounting_errors,
                    "over_budget": stats.over_budget, "refused": dict(stats.refused),
                    "bad_requests": dict(stats.bad_requests)}
        self._queue.put(("stats", records, counters))
        return True

    def close(self, timeout: float) -> None:
        """Send what is queued (for `timeout` s at most), then end the thread."""
        self._queue.put(None)
        self._sender.join(timeout)


def _send_all(outbox: "queue.SimpleQueue[tuple[Any, ...] | None]", pipe: Connection) -> None:
    while (message := outbox.get()) is not None:
        try:
            pipe.send(message)
        except (BrokenPipeError, ConnectionError, OSError):
            return  # the parent is gone


# -- the parent: /metrics over every worker --------------------------------------------------------------------


class Workers:
    """Starts the workers, feeds their records into `server.stats`, and stops them."""

    def __init__(self, server: Any, n: int, hang_seconds: float = HANG_SECONDS) -> None:
        self.server, self.n, self.hang_seconds = server, n, hang_seconds
        self.pids: list[int] = []
        self._procs: list[Any] = []
        self._pipes: list[Connection] = []
        self._counters: list[dict[str, Any]] = [{} for _ in range(n)]
        self._ready = 0
        self._started: asyncio.Future[None] | None = None
        self._heard = [0.0] * n  # when each worker last sent a whole message (time.monotonic)
        self._watchdog: asyncio.TimerHandle | None = None
        self._readers: list[threading.Thread] = []
        self._stopping = False
        self.died: asyncio.Event = asyncio.Event()

    async def start(self, timeout: float = 120.0) -> None:
        """Spawn the workers on the shared port; raise ConfigError when one cannot bind it."""
        config = self.server.config
        host, port = split_listen(config.listen)
        hold = None
        if port != 0:
            _refuse_a_taken_port(host, port)
        if port == 0:  # pick the port once, for all of them; held (not listening) until they have bound it
            hold = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            hold.bind((host or "0.0.0.0", 0))
            port = hold.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        worker_config = dataclasses.replace(config, listen=f"{shown}:{port}")
        loop = asyncio.get_running_loop()
        self._started = loop.create_future()
        ctx = multiprocessing.get_context("spawn")
        try:
            for i in range(self.n):
                reader, writer = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=worker_main, args=(worker_config, writer, logging.getLogger().level),
                                   name=f"rooflight-proxy-{i}", daemon=True)
                proc.start()
                writer.close()
                self._procs.append(proc)
                self._pipes.append(reader)
                self._listen(i, reader, loop)
            await asyncio.wait_for(self._started, timeout)
        except BaseException:
            await self.stop()
            raise
        finally:
            if hold is not None:
                hold.close()
        self.server.proxy_url = f"http://{shown}:{port}"
        self._heard = [time.monotonic()] * self.n
        self._watchdog = loop.call_later(self.hang_seconds / 4, self._watch)
        log.info("proxy on %s: %d worker processes (pids %s)", self.server.proxy_url, self.n,
                 ", ".join(map(str, self.pids)))

    def _watch(self) -> None:
        """Stop the proxy when a worker has sent nothing for hang_seconds (checked four times as often)."""
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        for i in range(len(self._pipes)):
            if now - self._heard[i] > self.hang_seconds and not self.died.is_set():
                log.error("proxy worker %d (pid %s) sent nothing for %.0f s (hung): stopping the proxy", i,
                          self._procs[i].pid, now - self._heard[i])
                self.died.set()
        if not self.died.is_set():
            self._watchdog = loop.call_later(self.hang_seconds / 4, self._watch)

    def _listen(self, i: int, pipe: Connection, loop: asyncio.AbstractEventLoop) -> None:
        """Read worker i's messages on a thread of its own, each handed to the loop whole. (Read on the loop, a
        message a stopped worker left half-written held the loop in recv(): /metrics and the hang watch too.)"""

        def read() -> None:
            while True:
                try:
                    message: tuple[Any, ...] | None = pipe.recv()
                except (EOFError, OSError):
                    message = None
                self._heard[i] = time.monotonic()
                try:
                    loop.call_soon_threadsafe(self._receive, i, message)
                except RuntimeError:
                    return  # the loop is closed
                if message is None:
                    return

        thread = threading.Thread(target=read, name=f"rooflight-proxy-worker-{i}", daemon=True)
        thread.start()
        self._readers.append(thread)

    def _receive(self, i: int, message: tuple[Any, ...] | None) -> None:
        """A whole message from worker i, or None when its pipe ended (the worker is gone)."""
        if message is not None:
            self._handle(i, message)
            return
        if self._stopping:
            return
        if self._started is not None and not self._started.done():
            self._started.set_exception(RuntimeError(f"worker {i} ended before it was ready"))
        else:
            log.error("proxy worker %d (pid %s) ended: stopping the proxy", i, self._procs[i].pid)
        self.died.set()

    def _handle(self, i: int, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "stats":
            observe = self.server.observe
            for record in message[1]:
                try:
                    observe(record)
                except Exception:  # accounting must never take the proxy down
                    log.debug("proxy accounting failed at request end", exc_info=True)
                    self._own_errors += 1
            self._counters[i] = message[2]
            self._sum_counters()
        elif kind == "ready":
            self.pids.append(message[1])
            self._ready += 1
            if self._ready == self.n and self._started is not None and not self._started.done():
                self._started.set_result(None)
        elif kind == "error" and self._started is not None and not self._started.done():
            self._started.set_exception(OSError(message[1]))

    def _sum_counters(self) -> None:
        stats, counters = self.server.stats, self._counters
        stats.in_flight = sum(c.get("in_flight", 0) for c in counters)
        stats.over_budget = sum(c.get("over_budget", 0) for c in counters)
        stats.accounting_errors = self._own_errors + sum(c.get("accounting_errors", 0) for c in counters)
        for name in ("refused", "bad_requests"):
            total: Counter[str] = Counter()
            for c in counters:
                total.update(c.get(name, {}))
            setattr(stats, name, total)

    _own_errors = 0  # records this process failed to observe are counted by stats.accounting_error() too

    async def stop(self) -> None:
        loop = asyncio.get_running_loop()
        self._stopping = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self._procs:
            await loop.run_in_executor(None, proc.join, 5.0)
            if proc.is_alive():
                proc.kill()
                await loop.run_in_executor(None, proc.join, 5.0)
        for thread in self._readers:  # each ends at its pipe's end, now that its worker has
            await loop.run_in_executor(None, thread.join, 5.0)
        for pipe, thread in zip(self._pipes, self._readers):
            if not thread.is_alive():  # (never closed under a thread still reading it)
                pipe.close()
        self._procs.clear()
        self._pipes.clear()
        self._readers.clear()


def _refuse_a_taken_port(host: str, port: int) -> None:
    """OSError when another process listens on the port. The workers bind with SO_REUSEPORT, which would let
    them share it with another proxy (the kernel splitting its clients between the two); a probe without it
    is refused where anything already listens."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed connection's TIME_WAIT is no owner
        probe.bind((host or "0.0.0.0", port))


async def run(config: ProxyConfig, n: int) -> int:
    """`rooflight proxy --workers N`: serve until SIGINT or SIGTERM (exit 0) or a worker's death (exit 1)."""
    from rooflight.agent.proxy.journal import opened
    from rooflight.agent.proxy.server import ProxyServer

    with opened(config.request_log) as journal:  # here too: the workers send their records to this process
        return await _serve(ProxyServer(config, journal=journal), n)


async def _serve(server: Any, n: int) -> int:
    from rooflight.agent.proxy.journal import ignore_hangup, reopen_on_hangup
    from rooflight.agent.proxy.limits import quiet_accept_errors
    from rooflight.agent.proxy.server import serve_metrics

    config = server.config
    workers = Workers(server, n)
    loop = asyncio.get_running_loop()
    quiet_accept_errors(loop)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    ignore_hangup(server.journal)
    try:
        await workers.start()
    except OSError as exc:
        raise ConfigError(f"--listen {config.listen}: cannot listen there ({exc}); stop the other process or"
                          " choose another address or port") from None
    reopen_on_hangup(server.journal)  # the workers are up, SIGHUP ignored in each
    if server.journal is not None:
        server.journal.reopen()  # a rotation's SIGHUP while they started was ignored (the same file: harmless)
    try:
        try:
            metrics = await serve_metrics(server)
        except OSError as exc:
            raise ConfigError(f"--metrics-listen {config.metrics_listen}: cannot listen there"
                              f" ({exc.strerror or exc}); stop the other process or choose another address or port"
                              ) from None
        try:
            ended = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(workers.died.wait())]
            refresher = asyncio.ensure_future(_refresh(server))
            await asyncio.wait(ended, return_when=asyncio.FIRST_COMPLETED)
            for task in (*ended, refresher):
                task.cancel()
        finally:
            await metrics.cleanup()
    finally:
        await workers.stop()
    return 1 if workers.died.is_set() and not stop.is_set() else 0


async def _refresh(server: Any) -> None:
    while True:
        await asyncio.sleep(server.config.refresh)
        server.refresh_now()
