"""`rooflight proxy --workers N`: N relay processes behind one port, one /metrics with every request in it.

One Python process relays on one core. Here this process (the parent) holds --listen: a thread of its own
accepts each connection, admits it against the port's one connection cap and per-client share
(limits.ConnectionShares, exact over all the workers: each worker counting its own let N workers admit N
times the cap) and hands the socket to a worker process (SCM_RIGHTS over a socketpair of its own): the one
with the fewest connections open among those heard from within SUSPECT_SECONDS. Each worker relays the
connections it is handed with its own ProxyServer and tells the parent when each ends. The parent serves
/metrics. The merge is exact because nothing is merged after the fact: each worker sends every finished
request's record (the same RequestRecord its own stats would have observed) to this process, which
observes them all in one ClientStats; percentiles, goodput and histograms are those of one proxy that saw
every request. The port's own counters (in flight, refused, bad requests, accounting errors) are the sums
of the workers' latest values and the parent's own refusals. A finished request's record travels within
RECORDS_WITHIN_SECONDS, and every worker sends its counters every FLUSH_SECONDS, which says it is alive.

Workers fail alone. One that dies (a crash, the OOM killer) is logged, counted
(rooflight_client_worker_restarts_total) and replaced; only the connections it held are cut, and the
requests it had finished are already with this process (and its --request-log). One that stops (SIGSTOP, a
frozen cgroup, a loop that no longer turns) is handed no new connection once silent for SUSPECT_SECONDS,
and is killed and replaced after HANG_SECONDS. A worker that keeps dying young is restarted less and less
often (RESTART_BACKOFF_SECONDS, doubling, at most RESTART_BACKOFF_MAX_SECONDS apart); while no worker is
ready, new connections wait in the kernel's backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import os
import queue
import select
import signal
import socket
import struct
import threading
import time
from collections import Counter
from multiprocessing.connection import Connection
from typing import Any

from rooflight.agent.errors import ConfigError
from rooflight.agent.proxy.config import ProxyConfig
from rooflight.agent.config.values import split_listen
from rooflight.agent.proxy import limits

log = logging.getLogger("rooflight.proxy")
FLUSH_SECONDS = 0.25  # how often a worker sends its counters, or a beat when they did not change
# ... and, where it feeds a head-of-line detector (`rooflight run --proxy-listen`), its gaps between tokens
# this often: within one of their slots (token_gaps.SlotMaxima), well within a sample's span (1.5 intervals)
GAPS_EVERY_SECONDS = 0.1
RECORDS_WITHIN_SECONDS = 0.01  # a finished request's record (or a closed connection) goes to the parent this soon
MAX_WORKERS = 256
MAX_QUEUED = 600  # batches a worker holds for a parent that has stopped reading its pipe
SUSPECT_SECONDS = 1.0  # a worker not heard from for this long (4 beats) is handed no new connection
HANG_SECONDS = 10.0  # a worker not heard from for this long is taken for hung: killed and replaced
READY_WITHIN_SECONDS = 120.0  # a worker (re)started must say it is ready within this, or it is replaced
LIVED_SECONDS = 10.0  # a worker that dies younger than this died young: the next start waits (backoff)
RESTART_BACKOFF_SECONDS = 0.5
RESTART_BACKOFF_MAX_SECONDS = 30.0
READY_WAIT_SECONDS = 5.0  # a connection accepted as the last ready worker died waits this long for a new one
# A burst fills a worker's hand-over queue (a unix socket holds net.unix.max_dgram_qlen messages, 10 by
# default): the accepting thread waits for a worker to read, this long at most, before it refuses.
HANDOFF_WAIT_SECONDS = 1.0
HANDOFF_RETRY_SECONDS = 0.002
_ID = struct.Struct("!Q")  # a handed connection's id, the message its socket travels with
NO_WORKER = "no_worker"  # refused: no worker took the connection (each one gone or not reading)
_BEAT = ("beat",)  # a worker's message when nothing changed: it lives (read by the parent's reading thread alone)


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


def worker_main(config: ProxyConfig, pipe: Connection, chan: socket.socket, log_level: int,
                gaps: bool = False) -> None:
    """A worker process's life. `gaps`: it feeds a head-of-line detector in the parent (its gaps between tokens
    and its loop's lateness go there with its records)."""
    if config.request_log is not None:  # the parent reopens the log on SIGHUP; a process group's ends no worker
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s %(name)s[{os.getpid()}]: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_worker(config, pipe, chan, gaps))


async def _worker(config: ProxyConfig, pipe: Connection, chan: socket.socket, gaps: bool = False) -> None:
    from rooflight.agent.proxy.server import ProxyServer

    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    records: list[Any] = []
    closed: list[int] = []  # ids of the handed connections that ended since the last batch
    due: list[asyncio.TimerHandle] = []
    outbox: Outbox | None = None

    def flush() -> None:
        if due:
            due.pop().cancel()
        if outbox is not None:
            outbox.put(server.stats, records[:], closed[:], slots.since() if slots is not None else None)
            records.clear()
            closed.clear()

    def soon() -> None:  # records and ends go within RECORDS_WITHIN_SECONDS, several at once when they come so
        if not due:
            due.append(loop.call_later(RECORDS_WITHIN_SECONDS, flush))

    def finished(record: Any) -> None:
        records.append(record)
        soon()

    def ended(cid: int) -> None:
        closed.append(cid)
        soon()

    server = ProxyServer(config, on_record=finished)
    slots = GapSlots(server.client_gaps) if gaps else None
    try:
        await server.start(refresh_loop=False, serve_metrics=False, listen=False, lag_probe=gaps)
    except OSError as exc:
        await server.stop()
        pipe.send(("error", exc.strerror or str(exc)))
        return
    pipe.send(("ready", os.getpid()))
    # The pipe is written by a thread of its own from now on: a parent busy rendering /metrics never holds
    # the relay up.
    outbox = Outbox(pipe)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    chan.setblocking(False)

    def receive() -> None:
        """The connections the parent handed over; its end closed: it went away, this worker ends too."""
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(chan, _ID.size, 1)
            except BlockingIOError:
                return
            except OSError:
                data, fds = b"", []
            if len(data) != _ID.size or not fds:
                for fd in fds:
                    os.close(fd)
                if not data:
                    loop.remove_reader(chan.fileno())
                    stop.set()
                    return
                continue
            cid = _ID.unpack(data)[0]
            server.adopt(socket.socket(fileno=fds[0]), lambda cid=cid: ended(cid))

    loop.add_reader(chan.fileno(), receive)

    every = GAPS_EVERY_SECONDS if gaps else FLUSH_SECONDS

    def beat() -> None:  # every FLUSH_SECONDS: what changed, else a beat that says this loop turns
        nonlocal beating
        flush()
        beating = loop.call_later(every, beat)

    beating = loop.call_later(every, beat)
    try:
        await stop.wait()
    finally:
        beating.cancel()
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(chan.fileno())
        await server.stop()
        flush()  # what ended while stopping
        await loop.run_in_executor(None, outbox.close, 5.0)
        chan.close()


class GapSlots:
    """What a worker's gaps between tokens and loop lateness (a ClientGaps) added since it last sent them: the
    slots from the last one sent (it may have grown) on, for the parent's copy to merge."""

    def __init__(self, gaps: Any) -> None:
        self._gaps = gaps
        self._from = {"gaps": -1, "lag": -1}

    def since(self) -> tuple[list[tuple[int, float]], list[tuple[int, float]]] | None:
        out = []
        for key, maxima in (("gaps", self._gaps), ("lag", self._gaps.loop_lag)):
            out.append(maxima.slots_since(self._from[key]))
            if maxima.open_slot is not None:
                self._from[key] = maxima.open_slot
        return (out[0], out[1]) if out[0] or out[1] else None


class Outbox:
    """A worker's batches for the parent, sent by a thread of their own, at most `limit` of them unsent: a
    parent that stops reading (hung, or stopped) must not grow every worker's memory with the traffic. Past
    the limit a batch's records are dropped and counted as accounting errors, which the next batch that goes
    carries, so /metrics says how many requests it is missing. (The ends of connections are never dropped:
    an id is 8 bytes, and each one dropped would hold a place under the parent's connection cap.)"""

    def __init__(self, pipe: Connection, limit: int = MAX_QUEUED) -> None:
        self.limit = limit
        self._sent: dict[str, Any] = {}  # the counters last queued
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._sender = threading.Thread(target=_send_all, args=(self._queue, pipe), name="rooflight-proxy-records",
                                        daemon=True)
        self._sender.start()

    def put(self, stats: Any, records: list[Any], closed: list[int] | None = None, gaps: Any = None) -> bool:
        """Queue `records` and the ids of `closed` connections with the worker's counters and its `gaps`
        (GapSlots.since; or, when none of them changed, a beat: the parent's clue that this worker lives); False
        (and the records counted lost) when full."""
        full = self._queue.qsize() >= self.limit
        if full:
            stats.accounting_errors += len(records)
            records = []
        counters = {"in_flight": stats.in_flight, "accounting_errors": stats.accounting_errors,
                    "over_budget": stats.over_budget, "refused": dict(stats.refused),
                    "bad_requests": dict(stats.bad_requests)}
        if records or closed or gaps or counters != self._sent:
            if not full or closed:
                self._queue.put(("stats", records, counters, closed or [], gaps))
                self._sent = counters
        elif not full:
            self._queue.put(_BEAT)
        return not full

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


# -- the parent: the port, the workers, /metrics over them all -----------------------------------------------


class _Slot:
    """One worker's place: the process in it now, when it was last heard from, the connections handed to it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: Any = None
        self.pid = 0
        self.pipe: Connection | None = None  # the worker's messages
        self.chan: socket.socket | None = None  # the parent's end of the socketpair the connections go over
        self.ready = False
        self.started = 0.0  # time.monotonic of the spawn, and of its "ready"
        self.heard = 0.0  # when it last sent a whole message
        self.open: dict[int, str] = {}  # handed connection id -> client address, until the worker says it ended
        self.handed = 0
        self.counters: dict[str, Any] = {}
        self.young_deaths = 0  # deaths in a row, each younger than LIVED_SECONDS
        self.respawn: asyncio.TimerHandle | None = None


class Workers:
    """Holds the port, starts the workers and replaces those that die or hang, hands each connection to one,
    feeds their records into `server.stats`, and stops them."""

    def __init__(self, server: Any, n: int, hang_seconds: float = HANG_SECONDS,
                 suspect_seconds: float = SUSPECT_SECONDS, gaps: bool = False) -> None:
        """`gaps`: the workers send their gaps between tokens into `server.client_gaps` (a head-of-line
        detector of the parent reads them: `rooflight run --proxy-listen`)."""
        self.server, self.n, self.gaps = server, n, gaps
        self.hang_seconds, self.suspect_seconds = hang_seconds, suspect_seconds
        self.slots = [_Slot(i) for i in range(n)]
        self.shares: limits.ConnectionShares | None = getattr(server, "connections", None)
        self.restarts = 0
        self.died = asyncio.Event()  # the proxy cannot go on (its accepting thread failed)
        self._lock = threading.Lock()  # the shares and each slot's open connections and channel
        self._own_refused: Counter[str] = Counter()  # the parent's admissions refused, by reason
        self._refusals = limits.RefusalLog("proxy: refused a connection from", logger=log)
        self._retired: dict[str, Any] = {"accounting_errors": 0, "over_budget": 0, "refused": Counter(),
                                         "bad_requests": Counter()}  # the counts of workers gone
        self._ids = itertools.count(1)
        self._any_ready = threading.Event()
        self._started: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1
        self._watchdog: asyncio.TimerHandle | None = None
        self._readers: list[threading.Thread] = []
        self._stopping = False
        self._worker_config: ProxyConfig | None = None
        self._own_errors = 0  # records this process failed to observe

    @property
    def pids(self) -> list[int]:
        """The ready workers' process ids."""
        return [slot.pid for slot in self.slots if slot.ready]

    async def start(self, timeout: float = READY_WITHIN_SECONDS) -> None:
        """Bind the port (OSError when it cannot be), spawn the workers, and accept once every one is ready."""
        config = self.server.config
        host, port = split_listen(config.listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host or "", port), family=family, backlog=1024,
                                              dualstack_ipv6=False)
        self._listener.setblocking(False)
        bound = self._listener.getsockname()
        shown = f"[{host}]" if ":" in host else host
        self._worker_config = dataclasses.replace(config, listen=f"{shown}:{bound[1]}")
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.create_future()
        fit = getattr(self.server, "_fit_to_open_files", None)
        if fit is not None:  # the one cap of every worker, fitted to this process's open-file limit
            fit()
        try:
            for slot in self.slots:
                self._spawn(slot)
            await asyncio.wait_for(self._started, timeout)
        except BaseException:
            await self.stop()
            raise
        self._wake_r, self._wake_w = os.pipe()
        self._acceptor = threading.Thread(target=self._accept_all, name="rooflight-proxy-accept", daemon=True)
        self._acceptor.start()
        self.server.proxy_url = f"http://{shown}:{bound[1]}"
        self.server.stats.worker_restarts = self.restarts
        self._watchdog = self._loop.call_later(self._watch_every(), self._watch, self._loop.time())
        log.info("proxy on %s: %d worker process%s (pid%s %s)", self.server.proxy_url, self.n,
                 "es" if self.n > 1 else "", "s" if self.n > 1 else "", ", ".join(map(str, self.pids)))

    # -- the workers' lives -----------------------------------------------------------------------------

    def _spawn(self, slot: _Slot) -> None:
        slot.respawn = None
        ctx = multiprocessing.get_context("spawn")
        reader, writer = ctx.Pipe(duplex=False)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        proc = ctx.Process(target=worker_main, args=(self._worker_config, writer, theirs, logging.getLogger().level,
                                                     self.gaps),
                           name=f"rooflight-proxy-{slot.index}", daemon=True)
        try:
            proc.start()
        finally:
            writer.close()
            theirs.close()
        mine.setblocking(False)
        with self._lock:
            slot.proc, slot.pipe, slot.chan, slot.ready, slot.pid = proc, reader, mine, False, proc.pid
            slot.started = slot.heard = time.monotonic()
            slot.counters = {}
        self._listen(slot, proc, reader)

    def _listen(self, slot: _Slot, proc: Any, pipe: Connection) -> None:
        """Read a worker's messages on a thread of its own, each handed to the loop whole. (Read on the loop,
        a message a stopped worker left half-written held the loop in recv(): /metrics and the hang watch.)"""
        loop = self._loop or asyncio.get_running_loop()

        def read() -> None:
            while True:
                try:
                    message: tuple[Any, ...] | None = pipe.recv()
                except (EOFError, OSError):
                    message = None
                if slot.proc is proc:
                    slot.heard = time.monotonic()
                if message == _BEAT:
                    continue  # (nothing for the loop: 20 wake-ups a second of two idle workers cost 1% of a core)
                try:
                    loop.call_soon_threadsafe(self._receive, slot, proc, message)
                except RuntimeError:
                    return  # the loop is closed
                if message is None:
                    return

        thread = threading.Thread(target=read, name=f"rooflight-proxy-worker-{slot.index}", daemon=True)
        thread.start()
        self._readers = [t for t in self._readers if t.is_alive()] + [thread]

    def _receive(self, slot: _Slot, proc: Any, message: tuple[Any, ...] | None) -> None:
        """A whole message from the worker `proc` in `slot`, or None when its pipe ended (it is gone)."""
        if slot.proc is not proc:
            return  # from a worker already replaced
        if message is not None:
            self._handle(slot.index, message)
        elif not self._stopping:
            self._gone(slot, "ended")

    def _handle(self, i: int, message: tuple[Any, ...]) -> None:
        kind, slot = message[0], self.slots[i]
        if kind == "stats":
            observe = self.server.observe
            for record in message[1]:
                try:
                    observe(record)
                except Exception:  # accounting must never take the proxy down
                    log.debug("proxy accounting failed at request end", exc_info=True)
                    self._own_errors += 1
            slot.counters = message[2]
            if len(message) > 3 and message[3]:
                self._ended(slot, message[3])
            if len(message) > 4 and message[4] is not None:
                client_gaps = self.server.client_gaps
                client_gaps.merge(message[4][0])
                client_gaps.loop_lag.merge(message[4][1])
            self._sum_counters()
        elif kind == "ready":
            with self._lock:
                slot.pid, slot.ready, slot.started = message[1], True, time.monotonic()
            self._any_ready.set()
            if self._started is not None and not self._started.done():
                if all(s.ready for s in self.slots):
                    self._started.set_result(None)
            else:
                log.warning("proxy worker %d replaced: pid %d relays from now on", i, message[1])
        elif kind == "error" and self._started is not None and not self._started.done():
            self._started.set_exception(OSError(message[1]))

    def _ended(self, slot: _Slot, ids: list[int]) -> None:
        """Connections a worker says have ended: out of the shares."""
        with self._lock:
            for cid in ids:
                client = slot.open.pop(cid, None)
                if client is not None and self.shares is not None:
                    self.shares.leave(client)

    def _gone(self, slot: _Slot, why: str) -> None:
        """The worker in `slot` ended (or was killed): its connections out of the shares, its counts kept, and a
        new worker in its place."""
        proc, cut = slot.proc, len(slot.open)
        in_flight = int(slot.counters.get("in_flight", 0))
        with self._lock:
            if self.shares is not None:
                for client in slot.open.values():
                    self.shares.leave(client)
            slot.open.clear()
            if slot.chan is not None:
                slot.chan.close()  # the connections still on their way to it are dropped with it
                slot.chan = None
            was_ready, slot.ready, slot.proc = slot.ready, False, None
            if not any(s.ready for s in self.slots):
                self._any_ready.clear()
        if slot.pipe is not None:  # (its reading thread has ended: it read the pipe's end)
            slot.pipe.close()
            slot.pipe = None
        self._retire(slot.counters)
        slot.counters = {}
        if self._loop is not None:
            self._loop.run_in_executor(None, proc.join, 5.0)  # (no zombie)
        if self._started is not None and not self._started.done():
            self._started.set_exception(RuntimeError(f"worker {slot.index} ended before it was ready"))
            return
        young = not was_ready or time.monotonic() - slot.started < LIVED_SECONDS
        slot.young_deaths = slot.young_deaths + 1 if young else 0
        delay = 0.0 if not slot.young_deaths else min(RESTART_BACKOFF_MAX_SECONDS,
                                                       RESTART_BACKOFF_SECONDS * 2 ** (slot.young_deaths - 1))
        self.restarts += 1
        self.server.stats.worker_restarts = self.restarts
        with self._lock:  # its requests in flight were cut before their records were made: unaccounted, counted
            self._own_errors += in_flight
        log.error("proxy worker %d (pid %s) %s: its %d connection(s) and %d request(s) in flight were cut; the"
                  " other workers go on, and a new worker takes its place%s", slot.index, slot.pid, why, cut,
                  in_flight, f" in {delay:g} s" if delay else "")
        self._sum_counters()
        slot.respawn = self._loop.call_later(delay, self._respawn, slot)  # type: ignore[union-attr]

    def _respawn(self, slot: _Slot) -> None:
        if self._stopping:
            return
        try:
            self._spawn(slot)
        except Exception as exc:  # (out of processes, memory): tried again later
            log.error("proxy worker %d could not be started (%s); trying again in %g s", slot.index, exc,
                      RESTART_BACKOFF_MAX_SECONDS)
            slot.respawn = self._loop.call_later(RESTART_BACKOFF_MAX_SECONDS, self._respawn, slot)  # type: ignore[union-attr]

    def _retire(self, counters: dict[str, Any]) -> None:
        """A gone worker's running totals, kept: the port's counters never go back."""
        retired = self._retired
        retired["accounting_errors"] += counters.get("accounting_errors", 0)
        retired["over_budget"] += counters.get("over_budget", 0)
        retired["refused"].update(counters.get("refused", {}))
        retired["bad_requests"].update(counters.get("bad_requests", {}))

    def _watch_every(self) -> float:
        return max(0.05, min(self.hang_seconds, self.suspect_seconds) / 2)

    def _watch(self, due: float) -> None:
        """Kill a worker not heard from for hang_seconds (its replacement follows from its end), or one not
        ready within READY_WITHIN_SECONDS of its start. A watch that itself ran late (this process was not
        scheduled) judges no one this time: what it last heard is as old as it was."""
        loop = asyncio.get_running_loop()
        late = loop.time() - due > self.hang_seconds / 2
        now = time.monotonic()
        for slot in self.slots:
            if late or slot.proc is None or slot.pid <= 0:
                continue
            if slot.ready and now - slot.heard > self.hang_seconds:
                log.error("proxy worker %d (pid %s) sent nothing for %.1f s (hung): killing it", slot.index, slot.pid,
                          now - slot.heard)
            elif not slot.ready and now - slot.started > READY_WITHIN_SECONDS:
                log.error("proxy worker %d (pid %s) not ready %.0f s after its start: killing it", slot.index,
                          slot.pid, now - slot.started)
            else:
                continue
            with contextlib.suppress(OSError):
                os.kill(slot.pid, signal.SIGKILL)  # (a stopped process dies of it too); its pipe's end follows
        every = self._watch_every()
        self._watchdog = loop.call_later(every, self._watch, loop.time() + every)

    # -- the port ------------------------------------------------------------------------------------------

    def _accept_all(self) -> None:
        """The accepting thread: admit each new connection and hand it over. While no worker is ready the
        connections wait in the kernel's backlog."""
        listener = self._listener
        assert listener is not None
        poller = select.poll()
        poller.register(listener.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        try:
            while not self._stopping:
                if not self._any_ready.wait(0.1):
                    continue
                poller.poll()
                for _ in range(64):  # (then poll again: the wake-up pipe is read between batches)
                    if self._stopping:
                        return
                    try:
                        conn, addr = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError as exc:  # out of open files: one line a minute, not a loop of tracebacks
                        limits.ACCEPT_FAILURES.note(f"cannot accept new connections ({exc.strerror or exc}); raise"
                                                    " the open-file limit (ulimit -n) or lower --max-connections",
                                                    "new connections")
                        time.sleep(0.05)
                        break
                    self._dispatch(conn, addr)
        except Exception:  # a bug here would leave the port unserved: say so and stop the proxy
            log.exception("proxy: the accepting thread failed; stopping")
            if self._loop is not None and not self._stopping:
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self.died.set)

    def _dispatch(self, conn: socket.socket, addr: Any) -> None:
        """Admit `conn` against the shares of every worker together and hand it to one; else 503 and close."""
        client = str(addr[0]) if isinstance(addr, (tuple, list)) and addr else "?"
        cid, tried, full = next(self._ids), set(), set()
        with self._lock:
            refused = self.shares.admit(client) if self.shares is not None else None
        waited, busy_until = False, 0.0
        while refused is None:
            with self._lock:  # (sent under the lock: a worker's end is never closed under the send)
                slot = self._pick(tried | full)
                if slot is not None:
                    try:
                        socket.send_fds(slot.chan, [_ID.pack(cid)], [conn.fileno()])  # type: ignore[arg-type]
                    except BlockingIOError:  # its queue is full (net.unix.max_dgram_qlen): busy, not gone
                        full.add(slot.index)
                        continue
                    except OSError:  # it is gone: another one
                        tried.add(slot.index)
                        continue
                    slot.open[cid] = client
                    slot.handed += 1
                    break
            if full and not self._stopping:  # every live worker's queue is full: a burst; wait for one to read
                busy_until = busy_until or time.monotonic() + HANDOFF_WAIT_SECONDS
                if time.monotonic() < busy_until:
                    full.clear()
                    time.sleep(HANDOFF_RETRY_SECONDS)
                    continue
            if tried or full or waited or self._stopping:  # every ready worker refused it, or none became ready
                with self._lock:
                    if self.shares is not None:
                        self.shares.leave(client)
                refused = NO_WORKER
            else:  # every worker died since the accept: wait for a new one
                waited = True
                self._any_ready.wait(READY_WAIT_SECONDS)
        if refused is not None:
            self._refuse(client, refused, conn)
        conn.close()  # (a worker holds its own copy of a connection handed over)

    def _pick(self, tried: set[int]) -> _Slot | None:
        """The ready worker with the fewest connections open among those heard from lately (all the ready ones
        when none was); None when none is ready."""
        now = time.monotonic()
        ready = [s for s in self.slots if s.ready and s.chan is not None and s.index not in tried]
        lately = [s for s in ready if now - s.heard < self.suspect_seconds] or ready
        return min(lately, key=lambda s: (len(s.open), s.handed), default=None)

    def _refuse(self, client: str, reason: str, conn: socket.socket) -> None:
        """Count and log the refusal (one line a minute at most) and answer 503 (the caller closes)."""
        shares = self.shares
        with self._lock:
            self._own_refused[reason] += 1
        if reason == NO_WORKER:
            why = "no worker could take it"
        else:
            limit = (shares.cap if reason == limits.MAX_CONNECTIONS else shares.per_client) if shares else 0
            why = f"over {limit} open connections ({reason})"
        self._refusals.note(f"{why}; answered 503", client)
        with contextlib.suppress(OSError):
            conn.setblocking(False)
            conn.send(limits.BUSY)

    def _sum_counters(self) -> None:
        stats, counters, retired = self.server.stats, [s.counters for s in self.slots], self._retired
        stats.in_flight = sum(c.get("in_flight", 0) for c in counters)
        stats.over_budget = retired["over_budget"] + sum(c.get("over_budget", 0) for c in counters)
        stats.accounting_errors = (self._own_errors + retired["accounting_errors"]
                                   + sum(c.get("accounting_errors", 0) for c in counters))
        with self._lock:
            own = Counter(self._own_refused)
        for name, mine in (("refused", own), ("bad_requests", Counter())):
            total: Counter[str] = Counter(retired[name])
            total.update(mine)
            for c in counters:
                total.update(c.get(name, {}))
            setattr(stats, name, total)

    async def stop(self) -> None:
        loop = asyncio.get_running_loop()
        self._stopping = True
        self._any_ready.set()  # (an accepting thread waiting for a worker: it sees the stop)
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for slot in self.slots:
            if slot.respawn is not None:
                slot.respawn.cancel()
        if self._acceptor is not None:
            os.write(self._wake_w, b"x")
            await loop.run_in_executor(None, self._acceptor.join, 5.0)
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
        if self._listener is not None:
            self._listener.close()  # no new connection from here
        procs = [slot.proc for slot in self.slots if slot.proc is not None]
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            await loop.run_in_executor(None, proc.join, 5.0)
            if proc.is_alive():
                proc.kill()
                await loop.run_in_executor(None, proc.join, 5.0)
        for thread in self._readers:  # each ends at its pipe's end, now that its worker has
            await loop.run_in_executor(None, thread.join, 5.0)
        with self._lock:
            for slot in self.slots:
                if slot.chan is not None:
                    slot.chan.close()
                    slot.chan = None
        if not any(t.is_alive() for t in self._readers):  # (never closed under a thread still reading it)
            for slot in self.slots:
                if slot.pipe is not None:
                    slot.pipe.close()
                    slot.pipe = None
        self._readers.clear()


async def run(config: ProxyConfig, n: int) -> int:
    """`rooflight proxy --workers N`: serve until SIGINT or SIGTERM (exit 0); workers that die or hang are
    replaced. Exit 1 only where the port can no longer be served (its accepting thread failed)."""
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
