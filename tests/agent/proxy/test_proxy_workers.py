"""`rooflight proxy --workers N`: N relay processes behind one port (the parent accepts and hands each connection
to one), one /metrics whose totals are every request sent, whichever worker relayed it."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import socket
import struct
import sys
import time
import types

import aiohttp
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from demo_procs import async_child, wait_healthy
from fake_upstream import FakeUpstream, Script
from rooflight.agent.errors import ConfigError
from rooflight.agent.proxy import catalog as c
from rooflight.agent.proxy.config import build
from rooflight.agent.proxy.server import ProxyServer
from rooflight.agent.proxy.workers import Outbox, Workers, parse_workers
from support import free_port

REQUESTS = 40
TOKENS = 4  # per request: one first token and three gaps


def totals(text: str) -> dict[str, float]:
    """Each sample name's value summed over its labels."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def one(port: int) -> bytes:
    """A streamed request on a connection of its own, so the kernel places each one afresh."""
    body = json.dumps({"model": "m", "stream": True, "stream_options": {"include_usage": True}}).encode()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", data=body) as r:
            assert r.status == 200
            return await r.read()


async def test_two_workers_share_the_port_and_metrics_count_every_request() -> None:
    up = FakeUpstream(scripts={"m": Script(ttft=0.01, gaps=(0.01,) * (TOKENS - 1))})
    await up.start()
    port, metrics_port = free_port(), free_port()
    try:
        async with async_child(
                sys.executable, "-m", "rooflight.agent.proxy.cli", "--upstream", up.url, "--listen", f"127.0.0.1:{port}",
                "--metrics-listen", f"127.0.0.1:{metrics_port}", "--workers", "2", "--slo", "ttft=5,tpot=5",
                "--log-level", "warning",
        ) as proc:
            async with aiohttp.ClientSession() as session:
                await wait_healthy(session, f"http://127.0.0.1:{metrics_port}/-/healthy")
                workers = psutil.Process(proc.pid).children()
                assert len(workers) >= 2  # the workers (and multiprocessing's resource tracker)
                bodies = await asyncio.gather(*(one(port) for _ in range(REQUESTS)))
                assert all(b.endswith(b"data: [DONE]\n\n") for b in bodies)
                # Both workers relayed some: each holds a kept-alive connection to the upstream now.
                up_port = int(up.url.rsplit(":", 1)[1])
                relaying = [w for w in workers
                            if any(conn.raddr and conn.raddr[1] == up_port for conn in w.net_connections("tcp"))]
                assert len(relaying) == 2, "the kernel gave every connection to one worker"
                m: dict[str, float] = {}
                for _ in range(100):  # records reach /metrics within a flush and a refresh (~1.1 s)
                    async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                        m = totals(await r.text())
                    if m.get(c.REQUESTS + "_total", m.get(c.REQUESTS, 0)) >= REQUESTS:
                        break
                    await asyncio.sleep(0.1)
            requests = m.get(c.REQUESTS + "_total", m.get(c.REQUESTS))
            assert requests == REQUESTS  # exactly: none lost, none twice
            assert m.get(c.OUTPUT_TOKENS + "_total", m.get(c.OUTPUT_TOKENS)) == REQUESTS * TOKENS
            assert m[c.TTFT_HISTOGRAM + "_count"] == REQUESTS
            assert m[c.ITL_HISTOGRAM + "_count"] == REQUESTS * (TOKENS - 1)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 20) == 0
        _, alive = psutil.wait_procs(workers, timeout=10)  # the workers (and spawn's resource tracker) end too
        assert not alive
    finally:
        await up.stop()


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "100000"])
def test_a_bad_worker_count_says_what_to_fix(value: str) -> None:
    with pytest.raises(ConfigError, match="--workers"):
        parse_workers(value)


def test_a_parent_that_stops_reading_bounds_a_workers_queue_and_every_request_is_accounted_for() -> None:
    """A worker's batches wait for a parent that reads none (its pipe full): at most `limit` are held (the
    queue grew with the traffic before), the rest are dropped, and each dropped request is counted as an
    accounting error in the counters of the next batch that goes, so /metrics still accounts for every one."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    stats = types.SimpleNamespace(in_flight=0, accounting_errors=0, over_budget=0, refused={}, bad_requests={})
    outbox = Outbox(writer, limit=5)
    record = "r" * 100_000  # one record per batch, larger than the pipe's buffer: the first send blocks
    queued = sum(outbox.put(stats, [record]) for _ in range(100))
    assert queued <= 5 + 2  # the limit, plus the batch the thread holds (and one it may have taken meanwhile)
    received = sum(len(reader.recv()[1]) for _ in range(queued))  # the parent reads again
    assert outbox.put(stats, [])
    kind, records, counters, closed, gaps = reader.recv()
    outbox.close(5.0)
    assert received == queued and counters["accounting_errors"] == 100 - queued  # none lost silently
    assert gaps is None  # (no gaps fed: `rooflight proxy --workers`)


async def test_a_message_a_stopped_worker_left_half_written_does_not_hold_the_parent() -> None:
    """The parent read each worker's pipe on its event loop: a worker stopped in the middle of writing a
    message (SIGSTOP, a frozen cgroup) left recv() waiting for the rest, with the loop, /metrics and the
    hang watch held in it. Now each pipe is read on a thread, the loop only gets whole messages, and the
    watch kills a worker silent for hang_seconds (here a stand-in process, which the watch must end)."""
    loop = asyncio.get_running_loop()
    config = build("http://127.0.0.1:9", listen="127.0.0.1:0", metrics_listen="127.0.0.1:0")
    workers = Workers(ProxyServer(config), 1, hang_seconds=1.0)
    workers._loop = loop
    stand_in = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(120)")
    reader, writer = multiprocessing.Pipe(duplex=False)
    slot = workers.slots[0]
    slot.proc, slot.pid, slot.pipe, slot.ready = stand_in, stand_in.pid, reader, True
    slot.started = slot.heard = time.monotonic()
    workers._listen(slot, stand_in, reader)
    try:
        writer.send(("stats", [], {"in_flight": 3}, []))
        os.write(writer.fileno(), struct.pack("!i", 1000) + b"the first bytes")  # 1,000 announced, 15 sent
        for _ in range(100):
            if workers.server.stats.in_flight == 3:
                break
            await asyncio.sleep(0.05)
        assert workers.server.stats.in_flight == 3  # the whole message was handled
        before = loop.time()
        await asyncio.sleep(0.2)
        assert loop.time() - before < 2.0  # the loop turns
        workers._watchdog = loop.call_later(0.25, workers._watch, loop.time() + 0.25)
        assert await asyncio.wait_for(stand_in.wait(), 20) == -signal.SIGKILL  # silent ~1 s: killed
    finally:
        if stand_in.returncode is None:
            stand_in.kill()
            await stand_in.wait()
        slot.proc = None  # (the stand-in is no worker: nothing to replace or stop)
        writer.close()
        await workers.stop()


async def test_workers_refuse_a_port_another_proxy_listens_on() -> None:
    """A port another process listens on, even with SO_REUSEPORT, is refused: sharing it, the kernel would split
    the clients between the two (a new user's trial: every other request went to a proxy in front of a dead
    upstream)."""
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as another proxy's workers hold it
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        config = build("http://127.0.0.1:9", listen=f"127.0.0.1:{port}", metrics_listen="127.0.0.1:0")
        workers = Workers(ProxyServer(config), 2)
        with pytest.raises(OSError):
            await workers.start()
        assert workers.pids == []  # refused before a worker was spawned
    finally:
        taken.close()


def test_the_ports_counters_are_the_sums_of_every_workers_latest() -> None:
    """/metrics over N workers shows one port: in flight now is what each worker holds now, added; refusals
    and bad requests are each worker's running totals, added by reason. Each worker's latest message replaces
    its previous one (they are totals, not increments)."""
    from types import SimpleNamespace

    from rooflight.agent.proxy.stats import ClientStats, StatsConfig
    from rooflight.agent.proxy.workers import Workers

    stats = ClientStats(StatsConfig(target="up:8000"), started=0.0)
    workers = Workers(SimpleNamespace(stats=stats, observe=stats.observe), 3)
    workers._handle(0, ("stats", [], {"in_flight": 3, "over_budget": 1, "accounting_errors": 0,
                                      "refused": {"per_client": 2}, "bad_requests": {"malformed": 1}}))
    workers._handle(1, ("stats", [], {"in_flight": 4, "over_budget": 0, "accounting_errors": 2,
                                      "refused": {"per_client": 1, "max_connections": 5}, "bad_requests": {}}))
    workers._handle(0, ("stats", [], {"in_flight": 1, "over_budget": 1, "accounting_errors": 0,
                                      "refused": {"per_client": 6}, "bad_requests": {"malformed": 1, "target": 2}}))
    # worker 2 has sent nothing yet: it adds nothing
    assert stats.in_flight == 1 + 4
    assert stats.over_budget == 1 and stats.accounting_errors == 2
    assert dict(stats.refused) == {"per_client": 6 + 1, "max_connections": 5}
    assert dict(stats.bad_requests) == {"malformed": 1, "target": 2}




def test_a_full_outbox_counts_every_record_of_the_batch_it_drops() -> None:
    """A batch of three records dropped at a full queue is three requests unaccounted, not one."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    stats = types.SimpleNamespace(in_flight=0, accounting_errors=0, over_budget=0, refused={}, bad_requests={})
    outbox = Outbox(writer, limit=0)  # full from the start: every batch with records is dropped
    try:
        assert not outbox.put(stats, ["a", "b", "c"])
        assert not outbox.put(stats, ["d"])
        assert stats.accounting_errors == 3 + 1
    finally:
        outbox.close(1.0)
        reader.close()


def test_records_the_parent_fails_to_observe_are_on_metrics_beside_the_workers() -> None:
    """A record the parent could not observe (a bug, a record it cannot read) is an accounting error of the
    port, added to what the workers report: with --workers, no request vanishes from /metrics."""
    from types import SimpleNamespace

    from rooflight.agent.proxy.stats import ClientStats, StatsConfig
    from rooflight.agent.proxy.workers import Workers

    stats = ClientStats(StatsConfig(target="up:8000"), started=0.0)

    def observe(record: object) -> None:
        raise ValueError(f"unreadable {record!r}")

    workers = Workers(SimpleNamespace(stats=stats, observe=observe), 2)
    workers._handle(0, ("stats", ["x", "y"], {"in_flight": 0, "over_budget": 0, "accounting_errors": 5,
                                              "refused": {}, "bad_requests": {}}))
    workers._handle(1, ("stats", [], {"in_flight": 0, "over_budget": 0, "accounting_errors": 1,
                                      "refused": {}, "bad_requests": {}}))
    assert stats.accounting_errors == 2 + 5 + 1


def test_a_worker_whose_hand_over_queue_is_full_is_waited_for_not_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst fills a live worker's hand-over queue (send_fds: EAGAIN). That worker is busy, not gone: the
    accepting thread waits for it to read and hands the connection over; no 503 "no worker"."""
    from types import SimpleNamespace

    from rooflight.agent.proxy import workers as w

    workers = w.Workers(SimpleNamespace(stats=None, observe=None), 1)
    slot = workers.slots[0]
    slot.ready, slot.chan, slot.heard = True, object(), time.monotonic()
    calls: list[int] = []

    def send_fds(chan: object, buffers: list[bytes], fds: list[int]) -> int:
        calls.append(fds[0])
        if len(calls) <= 3:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return 8

    monkeypatch.setattr(w.socket, "send_fds", send_fds)
    conn = socket.socket()
    workers._dispatch(conn, ("127.0.0.1", 5000))
    assert len(calls) == 4 and len(slot.open) == 1 and slot.handed == 1
    assert not workers._own_refused


def test_a_worker_that_never_reads_is_refused_after_the_hand_over_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait is bounded: a worker whose queue stays full (stopped, not yet taken for hung) costs one
    connection HANDOFF_WAIT_SECONDS, then a 503."""
    from types import SimpleNamespace

    from rooflight.agent.proxy import workers as w

    monkeypatch.setattr(w, "HANDOFF_WAIT_SECONDS", 0.2)
    workers = w.Workers(SimpleNamespace(stats=None, observe=None), 1)
    slot = workers.slots[0]
    slot.ready, slot.chan, slot.heard = True, object(), time.monotonic()

    def send_fds(chan: object, buffers: list[bytes], fds: list[int]) -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(w.socket, "send_fds", send_fds)
    monkeypatch.setattr(workers, "_refuse", lambda client, reason, conn: workers._own_refused.update([reason]))
    started = time.monotonic()
    workers._dispatch(socket.socket(), ("127.0.0.1", 5000))
    assert 0.2 <= time.monotonic() - started < 5.0
    assert workers._own_refused == {w.NO_WORKER: 1} and not slot.open
