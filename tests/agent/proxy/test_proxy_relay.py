"""The proxy over real HTTP on 127.0.0.1, in front of a scripted upstream with known latencies."""

from __future__ import annotations

import asyncio
import gzip
import time
import dataclasses
import hashlib
import json
from typing import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from yarl import URL

from fake_upstream import FakeUpstream, Script, whole_body
from rooflight.agent.proxy import catalog as c
from rooflight.agent.proxy import tracker as tr
from rooflight.agent.proxy.config import build
from rooflight.agent.proxy.server import ProxyServer
from rooflight.agent.proxy.tenants import tenant_key

SLO = "ttft=1,tpot=0.3"  # wide enough that a busy machine's loop stalls (~0.2 s at load 5) judge no fast stream bad
CHAT = "/v1/chat/completions"


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    up = FakeUpstream()
    await up.start()
    yield up
    await up.stop()


async def start_proxy(upstream_url: str, **flags: object) -> ProxyServer:
    config = build(upstream_url, listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", **flags)  # type: ignore[arg-type]
    server = ProxyServer(config)
    await server.start(refresh_loop=False, lag_probe=True)
    return server


@pytest.fixture
async def proxy(upstream: FakeUpstream) -> AsyncIterator[ProxyServer]:
    server = await start_proxy(upstream.url, slos=[SLO], tenant_header="X-Tenant")
    yield server
    await server.stop()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


async def metrics_text(r: aiohttp.ClientResponse) -> str:
    """A /metrics answer's text. The proxy's /metrics, the agent's handler, gzips for a client that accepts it
    (aiohttp's default); a session that compares relayed bytes as sent does not decompress it."""
    body = await r.read()
    gzipped = r.headers.get("Content-Encoding") == "gzip" and body[:2] == b"\x1f\x8b"
    return (gzip.decompress(body) if gzipped else body).decode()


async def scrape(server: ProxyServer, client: aiohttp.ClientSession) -> dict[str, dict[tuple, float]]:
    """name -> {labels without target: value}, read over HTTP from /metrics after a refresh."""
    server.refresh_now()
    async with client.get(server.metrics_url + "/metrics") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = await metrics_text(r)
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "target"))
            out.setdefault(s.name, {})[labels] = s.value
    return out


def chat(model: str, stream: bool = True) -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


async def post(client: aiohttp.ClientSession, base: str, body: bytes, path: str = CHAT,
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    h = {"Content-Type": "application/json", **(headers or {})}
    async with client.post(base + path, data=body, headers=h) as r:
        return r.status, dict(r.headers), await r.read()


def comparable(headers: dict[str, str]) -> dict[str, str]:
    """Headers that must be the same direct and proxied (Date moves; the chunk framing is per connection)."""
    return {k: v for k, v in headers.items() if k.lower() not in ("date", "transfer-encoding", "connection",
                                                                   "keep-alive")}


# -- bytes unchanged --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("script", [
    Script(ttft=0.01, gaps=(0.005,) * 20),
    Script(ttft=0.01, gaps=(0.005,) * 5, split_writes=True, usage=False),
    Script(ttft=0.0, gaps=(0.0,) * 30, chat=False, finish="length"),
])
async def test_a_stream_is_the_same_bytes_direct_and_proxied(upstream: FakeUpstream, proxy: ProxyServer,
                                                             client: aiohttp.ClientSession, script: Script) -> None:
    upstream.scripts["s"] = script
    path = CHAT if script.chat else "/v1/completions"
    direct = await post(client, upstream.url, chat("s"), path)
    proxied = await post(client, proxy.proxy_url, chat("s"), path)
    assert proxied[0] == direct[0] == 200
    assert proxied[2] == direct[2] and proxied[2].endswith(b"data: [DONE]\n\n")
    assert comparable(proxied[1]) == comparable(direct[1])
    m = await scrape(proxy, client)
    route = "chat" if script.chat else "completions"
    counted_by = "usage" if script.usage else "chunks"
    tokens = m[c.OUTPUT_TOKENS][(("counted_by", counted_by), ("tenant", "none"))]
    assert tokens == script.tokens
    hist = m[c.ITL_HISTOGRAM + "_count"][(("route", route),)]
    assert hist == script.tokens - 1  # every gap, even those between tokens that arrived together


async def test_the_request_reaches_the_upstream_unchanged(upstream: FakeUpstream, proxy: ProxyServer,
                                                          client: aiohttp.ClientSession) -> None:
    body = b'{"odd":  "spacing",\n "unicode": "\\u00e9\xc3\xa9"}'
    headers = {"Authorization": "Bearer sk-1", "X-Custom": "a", "Content-Type": "application/json; charset=utf-8",
               "Cookie": "k=v", "User-Agent": "my-client/1.0"}
    path = "/echo?b=2&a=1&a=%2F"
    seen = []
    for base in (upstream.url, proxy.proxy_url):
        async with client.post(URL(base + path, encoded=True), data=body, headers=headers) as r:
            seen.append(await r.json())
    assert seen[0]["sha256"] == hashlib.sha256(body).hexdigest()
    assert seen[1] == seen[0]  # body, query and every header (Host aside) as the client sent them
    assert upstream.seen[1].path == upstream.seen[0].path == path


async def test_a_large_body_is_streamed_to_the_upstream(upstream: FakeUpstream, client: aiohttp.ClientSession) -> None:
    server = await start_proxy(upstream.url)
    server.config = dataclasses.replace(server.config, max_buffered_body=1024)
    try:
        body = bytes(range(256)) * 4096  # 1 MiB, read and sent in pieces
        async with client.put(server.proxy_url + "/echo", data=body) as r:
            got = await r.json()
        assert (got["sha256"], got["length"]) == (hashlib.sha256(body).hexdigest(), len(body))
    finally:
        await server.stop()


async def test_non_streamed_json_is_relayed_and_counted(upstream: FakeUpstream, proxy: ProxyServer,
                                                        client: aiohttp.ClientSession) -> None:
    upstream.scripts["j"] = Script(ttft=0.01, gaps=(0.0,) * 3, prompt_tokens=12)
    direct = await post(client, upstream.url, chat("j", stream=False))
    proxied = await post(client, proxy.proxy_url, chat("j", stream=False))
    assert proxied[2] == direct[2] and proxied[0] == 200 and "Content-Length" in proxied[1]
    assert comparable(proxied[1]) == comparable(direct[1])
    m = await scrape(proxy, client)
    assert m[c.OUTPUT_TOKENS][(("counted_by", "usage"), ("tenant", "none"))] == 4
    assert m[c.PROMPT_TOKENS][(("counted_by", "usage"), ("tenant", "none"))] == 12
    assert m[c.E2E_HISTOGRAM + "_count"][(("route", "chat"),)] == 1
    assert c.TTFT_HISTOGRAM + "_count" not in m  # no first token before the whole answer
    assert m[c.REQUESTS][(("finish_reason", "stop"), ("route", "chat"), ("status", "200"), ("stream", "false"),
                          ("tenant", "none"))] == 1


async def test_a_pass_through_route(upstream: FakeUpstream, proxy: ProxyServer, client: aiohttp.ClientSession) -> None:
    async with client.get(upstream.url + "/v1/models") as r:
        direct = await r.read()
    async with client.get(proxy.proxy_url + "/v1/models") as r:
        assert r.status == 200 and await r.read() == direct
    m = await scrape(proxy, client)
    assert m[c.REQUESTS][(("finish_reason", "none"), ("route", "other"), ("status", "200"), ("stream", "false"),
                          ("tenant", "none"))] == 1
    assert c.E2E_HISTOGRAM + "_count" not in m


# -- errors reach the client as they were -------------------------------------------------------------------------


@pytest.mark.parametrize("code", [400, 404, 429, 500, 503])
async def test_upstream_error_statuses_pass_through(upstream: FakeUpstream, proxy: ProxyServer,
                                                    client: aiohttp.ClientSession, code: int) -> None:
    direct = await post(client, upstream.url, b"{}", f"/status/{code}")
    proxied = await post(client, proxy.proxy_url, b"{}", f"/status/{code}")
    assert proxied[0] == direct[0] == code
    assert proxied[2] == direct[2] and b"scripted" in proxied[2]
    assert comparable(proxied[1]) == comparable(direct[1]) and proxied[1]["Retry-After"] == "3"


async def test_an_unreachable_upstream_is_a_502(client: aiohttp.ClientSession) -> None:
    probe = FakeUpstream()
    await probe.start()
    dead = probe.url
    await probe.stop()  # nothing listens there now
    server = await start_proxy(dead)
    try:
        status, _, body = await post(client, server.proxy_url, chat("x"))
        assert status == 502 and b"rooflight proxy: upstream connect error" in body
        m = await scrape(server, client)
        assert m[c.UPSTREAM_ERRORS][(("reason", "connect"),)] == 1
        assert m[c.REQUESTS][(("finish_reason", "upstream_error"), ("route", "chat"), ("status", "502"),
                              ("stream", "false"), ("tenant", "none"))] == 1
    finally:
        await server.stop()


async def _read_until_broken(client: aiohttp.ClientSession, url: str, body: bytes) -> tuple[bytes, bool]:
    got, broken = b"", False
    async with client.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        try:
            while True:
                data = await r.content.readany()
                if not data:
                    break
                got += data
        except aiohttp.ClientPayloadError:
            broken = True
    return got, broken


async def test_a_stream_broken_upstream_is_broken_for_the_client(upstream: FakeUpstream, proxy: ProxyServer,
                                                                 client: aiohttp.ClientSession) -> None:
    upstream.scripts["b"] = Script(ttft=0.01, gaps=(0.01,) * 9, break_after=4)
    direct = await _read_until_broken(client, upstream.url + CHAT, chat("b"))
    proxied = await _read_until_broken(client, proxy.proxy_url + CHAT, chat("b"))
    assert direct[1] and proxied[1], "both must see a truncated response, not a clean end"
    assert proxied[0] == direct[0] and proxied[0].count(b"data: ") == 4
    m = await scrape(proxy, client)
    assert m[c.UPSTREAM_ERRORS][(("reason", "disconnected"),)] == 1
    judged = m[c.SLO_REQUESTS][(("slo", SLO), ("tenant", "none"))]
    assert judged == 1 and m[c.SLO_GOOD][(("slo", SLO), ("tenant", "none"))] == 0


async def test_a_client_disconnect_cancels_the_upstream_request(upstream: FakeUpstream, proxy: ProxyServer,
                                                                client: aiohttp.ClientSession) -> None:
    upstream.scripts["long"] = Script(ttft=0.01, gaps=(0.05,) * 200)
    r = await client.post(proxy.proxy_url + CHAT, data=chat("long"), headers={"Content-Type": "application/json"})
    first = await r.content.readany()
    assert first.startswith(b"data: ")
    r.close()  # the client goes away mid-stream
    await upstream.wait_cancelled(timeout=5.0)
    assert upstream.cancelled == ["long"] and upstream.finished == []
    for _ in range(50):  # the proxy's handler finishes its accounting right after
        if proxy.stats.in_flight == 0:
            break
        await asyncio.sleep(0.02)
    m = await scrape(proxy, client)
    assert m[c.IN_FLIGHT][()] == 0
    assert m[c.REQUESTS][(("finish_reason", "client_disconnected"), ("route", "chat"), ("status", "200"),
                          ("stream", "true"), ("tenant", "none"))] == 1
    assert c.SLO_REQUESTS not in m  # abandoned: not judged


async def test_a_disconnect_before_the_first_token_reaches_the_upstream(upstream: FakeUpstream, proxy: ProxyServer,
                                                                        client: aiohttp.ClientSession) -> None:
    upstream.scripts["queued"] = Script(ttft=30.0, gaps=(0.01,))
    task = asyncio.create_task(post(client, proxy.proxy_url, chat("queued")))
    for _ in range(100):
        if upstream.seen:
            break
        await asyncio.sleep(0.02)
    task.cancel()
    await upstream.wait_cancelled(timeout=5.0)
    assert upstream.cancelled == ["queued"]


# -- timings and goodput on known latencies -------------------------------------------------------------------------


async def test_goodput_is_exact_on_known_latencies(upstream: FakeUpstream, proxy: ProxyServer,
                                                   client: aiohttp.ClientSession) -> None:
    upstream.scripts.update({
        "fast": Script(ttft=0.01, gaps=(0.005,) * 4),  # TTFT ~10 ms, TPOT ~5 ms: good, by 100x and 60x
        "late": Script(ttft=2.0, gaps=(0.005,) * 4),  # TTFT 2 s > 1 s
        "slow": Script(ttft=0.01, gaps=(0.6,) * 3),  # TPOT 600 ms > 300 ms
    })
    models = ["fast", "fast", "fast", "late", "late", "slow"]
    results = await asyncio.gather(*(post(client, proxy.proxy_url, chat(m), headers={"X-Tenant": "t1"})
                                     for m in models))
    assert all(status == 200 for status, _, _ in results)
    m = await scrape(proxy, client)
    key = (("slo", SLO), ("tenant", tenant_key("t1")))
    assert m[c.SLO_REQUESTS][key] == 6 and m[c.SLO_GOOD][key] == 3
    assert m[c.GOODPUT_RATIO][(("slo", SLO), ("window", "1m"))] == pytest.approx(0.5)
    assert m[c.TTFT_HISTOGRAM + "_count"][(("route", "chat"),)] == 6
    assert m[c.ITL_HISTOGRAM + "_count"][(("route", "chat"),)] == 3 * 4 + 2 * 4 + 3
    ttft_p99 = m[c.TTFT][(("percentile", "99"), ("window", "10s"))]
    assert 2.0 <= ttft_p99 < 7.5  # measured, so at least the scripted 2 s
    tpot_p99 = m[c.TPOT][(("percentile", "99"), ("window", "10s"))]
    # ~0.6; a late read of the first token (one shared loop) shortens it by a third of the delay: over the
    # 0.3 target still (the slow streams are judged bad above), by 2x
    assert 0.3 < tpot_p99 < 2.5
    assert m[c.ITL][(("percentile", "99"), ("window", "10s"))] >= 0.6 * 0.995


# -- the traffic survives the accounting ---------------------------------------------------------------------------


async def test_accounting_failures_do_not_touch_the_traffic(upstream: FakeUpstream, proxy: ProxyServer,
                                                            client: aiohttp.ClientSession,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    upstream.scripts["s"] = Script(ttft=0.01, gaps=(0.002,) * 10)
    direct = await post(client, upstream.url, chat("s"))

    def boom(*args: object) -> None:
        raise RuntimeError("accounting bug")

    monkeypatch.setattr(tr.RequestTracker, "on_bytes", boom)
    assert (await post(client, proxy.proxy_url, chat("s")))[2] == direct[2]
    monkeypatch.undo()
    monkeypatch.setattr(proxy.stats, "observe", boom)
    assert (await post(client, proxy.proxy_url, chat("s")))[2] == direct[2]
    monkeypatch.setattr(tr, "RequestTracker", boom)
    assert (await post(client, proxy.proxy_url, chat("s")))[2] == direct[2]
    monkeypatch.undo()
    m = await scrape(proxy, client)
    assert m[c.ACCOUNTING_ERRORS][()] == 3
    # the first request was recorded without its tokens; the other two not at all
    assert sum(m[c.REQUESTS].values()) == 1


async def test_the_proxys_metrics_is_the_agents_handler(upstream: FakeUpstream, proxy: ProxyServer,
                                                        client: aiohttp.ClientSession) -> None:
    """`rooflight proxy`'s /metrics is agent/metrics/http.py's: gzip when asked, OpenMetrics when asked, name[]
    filtering, and one page per snapshot for every scraper."""
    await post(client, proxy.proxy_url, chat("x"))
    proxy.refresh_now()
    url = proxy.metrics_url + "/metrics"
    async with client.get(url, headers={"Accept-Encoding": "gzip"}) as r:
        zipped = await r.read()
        assert r.headers["Content-Encoding"] == "gzip" and zipped[:2] == b"\x1f\x8b"
    async with client.get(url, headers={"Accept-Encoding": "identity"}) as r:
        plain = await r.read()
        assert "Content-Encoding" not in r.headers and r.headers["Content-Type"].startswith("text/plain")
    assert gzip.decompress(zipped) == plain and b"rooflight_client_requests_total" in plain
    async with client.get(url, headers={"Accept": "application/openmetrics-text; version=1.0.0",
                                        "Accept-Encoding": "identity"}) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        assert (await r.read()).endswith(b"# EOF\n")
    async with client.get(url, params={"name[]": "rooflight_client_requests_total"},
                          headers={"Accept-Encoding": "identity"}) as r:
        names = {s.name for f in text_string_to_metric_families((await r.read()).decode()) for s in f.samples}
    assert names == {"rooflight_client_requests_total"}


async def test_tenants_are_hashed_in_the_metrics(upstream: FakeUpstream, proxy: ProxyServer,
                                                 client: aiohttp.ClientSession) -> None:
    for tenant in ("alpha-corp", "beta-corp", None):
        await post(client, proxy.proxy_url, chat("x"), headers={"X-Tenant": tenant} if tenant else None)
    proxy.refresh_now()
    async with client.get(proxy.metrics_url + "/metrics") as r:
        text = await metrics_text(r)
    assert "alpha-corp" not in text and f'tenant="{tenant_key("alpha-corp")}"' in text
    assert f'tenant="{tenant_key("beta-corp")}"' in text and 'tenant="none"' in text
    async with client.get(proxy.metrics_url + "/-/healthy") as r:
        assert r.status == 200


async def test_head_requests_and_keep_alive_to_the_upstream(upstream: FakeUpstream, proxy: ProxyServer,
                                                            client: aiohttp.ClientSession) -> None:
    got = []
    for base in (upstream.url, proxy.proxy_url):
        async with client.head(base + "/echo") as r:
            got.append((r.status, r.headers.get("Content-Length"), await r.read()))
    assert got[1] == got[0] and got[0][2] == b""
    before = len(upstream.seen)
    for _ in range(3):
        await post(client, proxy.proxy_url, chat("x"))
    peers = {s.peer for s in upstream.seen[before:]}
    assert len(peers) == 1, "finished responses must return their upstream connection to the pool"


PAUSE = 2.0  # seconds a client stops reading mid-stream


async def test_a_client_that_stops_reading_is_felt_by_it_but_not_blamed_on_the_engine(
    upstream: FakeUpstream, proxy: ProxyServer, client: aiohttp.ClientSession,
) -> None:
    """A client that pauses fills its socket buffers and holds the proxy's writes back; the gap it feels
    is its ITL, but the head-of-line feed sees only the upstream's 1 ms gaps (a busy machine stretches one
    now and then: the bound is a quarter of the 2 s pause that would be blamed, not a few milliseconds)."""
    upstream.scripts["s"] = Script(ttft=0.0, gaps=(0.001,) * 40, pad=256 * 1024)
    started = proxy.clock.monotonic()
    async with client.post(proxy.proxy_url + CHAT, data=chat("s"), headers={"Content-Type": "application/json"}) as r:
        assert r.status == 200
        await r.content.readany()
        await asyncio.sleep(PAUSE)  # the upstream's 41 x 256 KB outgrow every buffer on the way
        rest = await r.read()
    assert rest.endswith(b"data: [DONE]\n\n")
    metrics = await scrape(proxy, client)
    felt = metrics["rooflight_client_inter_token_latency_seconds_bucket"]
    over_half_a_second = sum(v for labels, v in felt.items() if ("le", "+Inf") in labels) - sum(
        v for labels, v in felt.items() if ("le", "0.5") in labels)
    assert over_half_a_second >= 1  # the client felt its own pause as a gap
    worst = proxy.client_gaps.worst_between(started, proxy.clock.monotonic())
    assert worst is not None and worst < PAUSE / 4, worst


async def _stream_with_a_busy_loop_beside_it(upstream: FakeUpstream, proxy: ProxyServer,
                                             client: aiohttp.ClientSession, busy) -> tuple[float, float | None, float | None]:
    """A stream of 5 ms gaps through the proxy while `busy()` runs on the proxy's loop mid-way; the worst gap
    and the worst stall the head-of-line feed reports over it."""
    upstream.scripts["steady"] = Script(ttft=0.0, gaps=(0.005,) * 120)
    started = proxy.clock.monotonic()

    async def beside() -> None:
        await asyncio.sleep(0.2)
        await busy()

    side = asyncio.create_task(beside())
    status, _, _ = await post(client, proxy.proxy_url, chat("steady"))
    await side
    ended = proxy.clock.monotonic()
    assert status == 200
    return ended - started, proxy.client_gaps.worst_between(started, ended), proxy.client_gaps.stall_between(started, ended)


async def test_a_loop_held_up_beside_the_streams_is_not_a_stall(upstream: FakeUpstream, proxy: ProxyServer,
                                                               client: aiohttp.ClientSession) -> None:
    async def hold_the_loop() -> None:
        time.sleep(0.3)  # what a large JSON decode or a garbage collection does to every stream

    _, worst, stall = await _stream_with_a_busy_loop_beside_it(upstream, proxy, client, hold_the_loop)
    assert worst is not None and worst >= 0.25  # the streams did wait
    assert stall is not None and stall < 0.1, stall  # but the loop's probe saw why


async def test_a_large_non_streamed_answer_does_not_hold_the_streams_up(upstream: FakeUpstream, proxy: ProxyServer,
                                                                       client: aiohttp.ClientSession) -> None:
    """Its accounting scans the 7.7 MB (logprobs: many small objects; under the 8 MiB the proxy reads) instead
    of decoding it, so the other streams' gaps stay the upstream's: under a third of what one json.loads of
    the body takes on this machine now. On a loaded 2-core machine that decode took 0.23-0.77 s, the worst gap
    20-64 ms, and with the body decoded on the loop the worst gap was 0.6-1.3x the decode."""
    upstream.scripts["big"] = Script(ttft=0.0, gaps=(0.0,) * 19, logprobs=35_000)
    body = whole_body("big", upstream.scripts["big"])  # encoded before the clock runs: not the proxy's cost
    started = time.perf_counter()
    json.loads(body)
    decode = time.perf_counter() - started  # the baseline, measured under the same load as the stream

    async def large_answer() -> None:
        status, _, body = await post(client, proxy.proxy_url, chat("big", stream=False))
        assert status == 200 and len(body) > 5_000_000

    _, worst, _ = await _stream_with_a_busy_loop_beside_it(upstream, proxy, client, large_answer)
    assert worst is not None and worst < decode / 3, (worst, decode)
    proxy.refresh_now()
    requests = [v for labels, v in (await scrape(proxy, client))["rooflight_client_output_tokens_total"].items()
                if ("counted_by", "usage") in labels]
    assert sum(requests) == 20 + 121  # usage read from both answers, the large one by scanning

