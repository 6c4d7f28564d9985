"""`rooflight proxy --workers N` when a worker fails: it fails alone. Real processes, real sockets: the proxy's
own command (or its Workers, with a short hang time), a fake upstream, clients on 127.0.0.1.

A worker killed cut every stream of every worker and the proxy exited 1; a stopped one kept its share of new
connections, which waited until the client gave up; the connection cap and the per-client share were each
worker's, so N workers admitted N times the cap.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import aiohttp
import psutil
from prometheus_client.parser import text_string_to_metric_families

from demo_procs import async_child, wait_healthy
from fake_upstream import FakeUpstream, Script
from rooflight.agent.proxy.config import build
from rooflight.agent.proxy import catalog as c
from rooflight.agent.proxy.server import ProxyServer
from rooflight.agent.proxy.workers import Workers
from support import free_port

LONG = Script(ttft=0.01, gaps=(0.05,) * 60)  # a 3 s stream
SHORT = Script(ttft=0.01, gaps=(0.01,) * 3)


def metric(text: str, name: str) -> float:
    """A sample's value summed over its labels (0 when absent)."""
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


async def raw_stream(port: int, model: str, source: str = "127.0.0.1") -> tuple[int, bytes]:
    """A streamed request on a socket of its own, read to the end: (the client's port, what came)."""
    body = json.dumps({"model": model, "stream": True, "stream_options": {"include_usage": True}}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    mine = writer.get_extra_info("sockname")[1]
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
    got = b""
    try:
        while data := await asyncio.wait_for(reader.read(65536), 30):
            got += data
    except ConnectionError:
        pass  # cut: what came so far is the answer
    writer.close()
    return mine, got


def whole(answer: bytes) -> bool:
    return answer.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in answer and answer.endswith(b"0\r\n\r\n")


def workers_of(pid: int) -> list[psutil.Process]:
    return [w for w in psutil.Process(pid).children() if "resource_tracker" not in " ".join(w.cmdline())]


def client_ports(worker: psutil.Process, proxy_port: int) -> set[int]:
    """The client ports of the connections a worker holds on the proxy's port."""
    return {conn.raddr[1] for conn in worker.net_connections("tcp")
            if conn.laddr and conn.laddr[1] == proxy_port and conn.raddr}


async def test_a_worker_killed_cuts_only_its_own_streams_and_is_replaced(tmp_path: object) -> None:
    up = FakeUpstream(scripts={"long": LONG, "short": SHORT})
    await up.start()
    port, metrics_port = free_port(), free_port()
    log_path = f"{tmp_path}/requests.jsonl"
    try:
        async with async_child(
                sys.executable, "-m", "rooflight.agent.proxy.cli", "--upstream", up.url, "--listen", f"127.0.0.1:{port}",
                "--metrics-listen", f"127.0.0.1:{metrics_port}", "--workers", "2", "--log-level", "warning",
                "--request-log", log_path,
        ) as proc:
            async with aiohttp.ClientSession() as session:
                await wait_healthy(session, f"http://127.0.0.1:{metrics_port}/-/healthy", proc)
                first = workers_of(proc.pid)
                assert len(first) == 2
                done = await asyncio.gather(*(raw_stream(port, "short") for _ in range(10)))
                assert all(whole(a) for _, a in done)
                await asyncio.sleep(0.3)  # (a record reaches the parent within 10 ms of its request's end)
                streams: list[asyncio.Future[tuple[int, bytes]]] = []
                held: dict[int, set[int]] = {}
                for _ in range(3):  # (a worker its parent has not heard from for 1 s gets none: more, then)
                    streams += [asyncio.ensure_future(raw_stream(port, "long")) for _ in range(8)]
                    for _ in range(100):  # until every stream is held (the parent hands them out evenly)
                        await asyncio.sleep(0.05)
                        held = {w.pid: client_ports(w, port) for w in first}
                        if sum(map(len, held.values())) == len(streams):
                            break
                    if all(held.values()):
                        break
                victim, survivor = first
                assert held[victim.pid] and held[survivor.pid], held
                for _ in range(100):  # every stream in flight as the parent last heard (each worker says so every 0.25 s)
                    async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                        if metric(await r.text(), c.IN_FLIGHT) == len(streams):
                            break
                    await asyncio.sleep(0.05)
                victim.kill()
                answers = dict(await asyncio.gather(*streams))
                # Only the killed worker's streams were cut; every one of the other's ran to its end.
                assert all(whole(answers[p]) for p in held[survivor.pid])
                assert not any(whole(answers[p]) for p in held[victim.pid])
                assert all(answers[p].startswith(b"HTTP/1.1 200") for p in held[victim.pid])  # begun, then cut
                # A new worker took its place; the proxy never stopped.
                replaced: list[psutil.Process] = []
                for _ in range(600):
                    replaced = workers_of(proc.pid)
                    if len(replaced) == 2 and victim.pid not in {w.pid for w in replaced}:
                        break
                    await asyncio.sleep(0.1)
                assert len(replaced) == 2 and survivor.pid in {w.pid for w in replaced}
                assert proc.returncode is None
                await asyncio.sleep(1.0)  # the new worker says it is ready
                after = await asyncio.gather(*(raw_stream(port, "short") for _ in range(10)))
                assert all(whole(a) for _, a in after)
                text = ""
                for _ in range(100):
                    async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                        text = await r.text()
                    if metric(text, c.REQUESTS) >= 10 + len(held[survivor.pid]) + 10:
                        break
                    await asyncio.sleep(0.1)
                assert metric(text, c.WORKER_RESTARTS) == 1
                # every request that finished is counted (the cut ones never finished: their worker died), and
                # the cut ones are counted unaccounted, as many as the dead worker last said it held in flight
                assert metric(text, c.REQUESTS) == 10 + len(held[survivor.pid]) + 10
                assert metric(text, c.ACCOUNTING_ERRORS) == len(held[victim.pid])
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
            said = (await proc.stderr.read()).decode()  # type: ignore[union-attr]
            assert f"pid {victim.pid}) ended" in said and "a new worker takes its place" in said
        lines = [json.loads(line) for line in open(log_path)]
        # The killed worker's finished requests were in the log already, the survivor's too.
        assert sum(1 for line in lines if line["outcome"] == "complete") == 10 + len(held[survivor.pid]) + 10
    finally:
        await up.stop()


async def test_a_stopped_worker_gets_no_new_connections_and_is_replaced() -> None:
    """SIGSTOP: the process lives, its loop does not turn. New connections go to the others from
    SUSPECT_SECONDS on; at hang_seconds it is killed and a new worker takes its place, the proxy serving on."""
    up = FakeUpstream(scripts={"short": SHORT})
    await up.start()
    config = build(up.url, listen="127.0.0.1:0", metrics_listen="127.0.0.1:0")
    workers = Workers(ProxyServer(config), 2, hang_seconds=5.0)
    await workers.start()
    stopped: psutil.Process | None = None
    try:
        port = int(workers.server.proxy_url.rsplit(":", 1)[1])
        assert all(whole(a) for _, a in await asyncio.gather(*(raw_stream(port, "short") for _ in range(4))))
        stopped = psutil.Process(workers.pids[0])
        stopped.suspend()
        await asyncio.sleep(2.0)  # past SUSPECT_SECONDS (1 s)
        answers = await asyncio.gather(*(raw_stream(port, "short") for _ in range(20)))
        # none went to the stopped worker: one handed to it would have been cut at its kill (5 s)
        assert all(whole(a) for _, a in answers)
        for _ in range(300):
            if len(workers.pids) == 2 and stopped.pid not in workers.pids:
                break
            await asyncio.sleep(0.1)
        assert len(workers.pids) == 2 and stopped.pid not in workers.pids  # replaced
        assert not stopped.is_running() or stopped.status() == psutil.STATUS_ZOMBIE
        assert workers.restarts == 1 and not workers.died.is_set()
        answers = await asyncio.gather(*(raw_stream(port, "short") for _ in range(20)))
        assert all(whole(a) for _, a in answers)
    finally:
        if stopped is not None and stopped.is_running():
            stopped.resume()
        await workers.stop()
        await up.stop()


async def open_idle(port: int, n: int, source: str) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    return [await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)) for _ in range(n)]


async def admitted(conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> int:
    """How many are held open, waiting for a request (a refused one was answered 503 and closed)."""
    async def one(reader: asyncio.StreamReader) -> bool:
        try:
            data = await asyncio.wait_for(reader.read(100), 1.5)
        except asyncio.TimeoutError:
            return True
        assert data.startswith(b"HTTP/1.1 503") or not data
        return False

    return sum(await asyncio.gather(*(one(r) for r, _ in conns)))


async def test_the_connection_cap_and_the_per_client_share_hold_over_all_workers() -> None:
    up = FakeUpstream()
    await up.start()
    port, metrics_port = free_port(), free_port()
    try:
        async with async_child(
                sys.executable, "-m", "rooflight.agent.proxy.cli", "--upstream", up.url, "--listen", f"127.0.0.1:{port}",
                "--metrics-listen", f"127.0.0.1:{metrics_port}", "--workers", "2", "--log-level", "error",
                "--max-connections", "12", "--max-connections-per-client", "8", "--read-header-timeout", "60s",
        ) as proc:
            async with aiohttp.ClientSession() as session:
                await wait_healthy(session, f"http://127.0.0.1:{metrics_port}/-/healthy", proc)
                one = await open_idle(port, 20, "127.0.0.1")
                assert await admitted(one) == 8  # the share, over both workers (each had its own 8 before)
                two = await open_idle(port, 20, "127.0.0.2")
                assert await admitted(two) == 12 - 8  # the cap, over both workers
                for _, writer in one + two:
                    writer.close()
                again: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
                for _ in range(50):  # the workers tell the parent of each end: the places come back
                    again = await open_idle(port, 8, "127.0.0.2")
                    if await admitted(again) == 8:
                        break
                    for _, writer in again:
                        writer.close()
                    await asyncio.sleep(0.2)
                assert await admitted(again) == 8
                async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                    text = await r.text()
                assert metric(text, c.REFUSED) >= (20 - 8) + (20 - 4)
                for _, writer in again:
                    writer.close()
    finally:
        await up.stop()
