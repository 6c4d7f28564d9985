"""The reverse proxy: every request relayed byte for byte, each timed on the side.

Traffic first: aiohttp's server reads the request; its method, path, query, header lines (as their bytes)
and body go to the upstream unchanged (only hop-by-hop headers, Host and Expect are left to the connection),
and the response's status, reason, header lines and body come back unchanged, each read from the upstream
written to the client's socket in the callback that read it (agent/proxy/relay.py), never buffered past the
client's transport's high-water mark. When the client goes away the handler is cancelled and the upstream connection closed, which
is how an OpenAI-compatible server learns to abort the request. When the upstream cannot be reached the
client gets 502 (504 on a connect timeout); when it breaks off mid-response the client's connection is
cut too, so it sees the same truncated response it would have seen directly.

Memory is bounded: request bodies are read whole (to keep their Content-Length) only while the bodies held
at once stay under `max_buffered_total`, else streamed like large ones; the response is never buffered, and
the accounting's copies of answers (a JSON body, an SSE parser's unfinished event) are bounded per answer
and, in total, by `max_accounting_total` (past it an answer is relayed unaccounted, and counted). A request the proxy cannot relay
(an absolute-form target) gets 400, an upstream reason with control characters is relayed without them,
and an upstream answer that cannot be relayed at all gets 502: counted, logged one line a minute at most
without the client's bytes, never a traceback. A request body not in after `read_body_timeout` s of waiting
for the client in all closes its connection (`_stream`). The port's header and idle timeouts and its connection
cap with a per-client share are agent/proxy/limits.py's.

Accounting second: a `RequestTracker` sees each piece after the loop turn that wrote it to the client (its
time is when it reached the proxy); the request's clock starts at its first byte on the proxy's socket
(limits.ProxyHandler.request_arrived). Every call into the tracker, and the record it makes at the end, is guarded, so an
accounting failure costs the request its metrics (counted in `rooflight_client_accounting_errors_total`),
never its bytes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any, AsyncIterator, Callable

from aiohttp import HttpVersion11, web
from aiohttp.http_exceptions import HttpProcessingError

from rooflight.agent.metrics.http import metrics_handler
from rooflight.agent.proxy import limits
from rooflight.agent.proxy import relay as rl
from rooflight.agent.proxy import tracker as tr
from rooflight.agent.proxy.config import ProxyConfig
from rooflight.agent.config.urls import shown_url
from rooflight.agent.proxy.exposition import ClientCollector, registry_for
from rooflight.agent.proxy.journal import RequestJournal
from rooflight.agent.proxy.stats import EMPTY, ClientSnapshot, ClientStats, StatsConfig
from rooflight.agent.proxy.tenants import tenant_key
from rooflight.agent.proxy.tracker import ByteBudget
from rooflight.agent.sampling.clock import Clock, SystemClock
from rooflight.agent.config.values import split_listen
from rooflight.agent.signals.token_gaps import ClientGaps

log = logging.getLogger("rooflight.proxy")
LAG_PROBE_SECONDS = 0.01  # how often the proxy checks that its event loop is not held up

# A status reason is relayed with printable ASCII only: a control character would split the status line.
_REASON_CHARS = frozenset(chr(c) for c in range(0x20, 0x7F)) | {"\t"}


def safe_reason(reason: str | None) -> str | None:
    """The upstream's status reason minus the characters that cannot go on a status line."""
    if reason is None or all(ch in _REASON_CHARS for ch in reason):
        return reason
    return "".join(ch for ch in reason if ch in _REASON_CHARS).strip()


class ProxyServer:
    """The proxy app, its metrics app, and the stats they share (one event loop, no locks)."""

    def __init__(self, config: ProxyConfig, clock: Clock | None = None, *,
                 on_record: Callable[[tr.RequestRecord], None] | None = None,
                 journal: RequestJournal | None = None) -> None:
        """`on_record` is for a worker process (agent/proxy/workers.py): its finished requests sent to the
        process that exports them. `journal`: --request-log's, handed every finished request that `observe`
        counts."""
        self.config = config
        self.clock = clock or SystemClock()
        # read once per upstream read: the system's clock without SystemClock's frame around it
        self._now = time.monotonic if type(self.clock) is SystemClock else self.clock.monotonic
        self.stats = ClientStats(
            StatsConfig(target=config.target, buckets=config.buckets, windows=config.windows,
                        percentiles=config.percentiles, slos=config.slos, tenant_top=config.tenant_top),
            started=self._now(),
        )
        self.snapshot: ClientSnapshot = EMPTY
        self._on_record = on_record
        self.journal = journal
        # every gap between tokens, live, for the head-of-line detector: fed only where one reads it
        # (start(lag_probe=True)); `rooflight proxy` has none, and feeding it cost ~4% of its CPU a chunk
        self.client_gaps = ClientGaps()
        self._feed_gaps = False
        self.registry = registry_for(lambda: self.snapshot)
        self._pool: rl.UpstreamPool | None = None
        self._runners: list[web.AppRunner] = []
        self._servers: list[asyncio.AbstractServer] = []  # the proxy's port (its runner has no site)
        self.connections = limits.ConnectionShares(config.max_connections, config.max_connections_per_client)
        self.events = limits.Events(self._count_event)
        self._refresher: asyncio.Task[None] | None = None
        self._lag_probe: asyncio.Task[None] | None = None
        self.body_budget = ByteBudget(config.max_buffered_total)
        self.accounting_budget = ByteBudget(config.max_accounting_total)  # copies of answers, to read them
        self.proxy_url = ""
        self.metrics_url = ""
        self._undo_quiet: Any = None  # the loop's accept-error handler, put back by stop()
        self._handler: Callable[[str, Any], limits.ProxyHandler] | None = None  # for adopt(), without a port
        self._adopting: set[asyncio.Task[Any]] = set()

    def observe(self, record: tr.RequestRecord) -> None:
        """A finished request into the exports (and the request log, where there is one)."""
        self.stats.observe(record)
        if self.journal is not None:
            self.journal.add(record)

    def collector(self) -> ClientCollector:
        """For an agent that serves these metrics on its own /metrics (`rooflight run` with a proxy)."""
        return ClientCollector(lambda: self.snapshot)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self, *, refresh_loop: bool = True, serve_metrics: bool = True, lag_probe: bool = False,
                    listen: bool = True) -> None:
        """Bind the proxy (and, unless `serve_metrics` is False, its own /metrics port) and start relaying.

        A worker process (agent/proxy/workers.py) passes serve_metrics=False and listen=False: no port of its
        own, the connections come through `adopt`, its records go to its parent (under `rooflight run`, the
        agent, which serves `collector()` of a ProxyServer of its own on its /metrics); and lag_probe=True where
        a head-of-line detector reads `client_gaps` (nothing else needs the probe: the worker sends them on).
        A failed bind raises OSError; call stop() to release what was already set up."""
        self._undo_quiet = limits.quiet_accept_errors(asyncio.get_running_loop())
        if listen:  # (a worker's parent fits the one cap of all workers)
            self._fit_to_open_files()
        # keepalive under uvicorn's 5 s (vLLM, SGLang): the proxy drops an idle connection before the upstream
        # does. limit: one upstream socket per client connection at most.
        self._pool = rl.UpstreamPool(self.config.upstream, self.config.connect_timeout, limit=self.connections.cap,
                                     keepalive=4.0)
        if listen:
            self.proxy_url = await self._serve(self.proxy_app(), self.config.listen, clients=True)
        else:
            runner = await self._runner(self.proxy_app())
            self._handler = self._handler_for(runner)
        if serve_metrics:
            self.metrics_url = await self._serve(self.metrics_app(), self.config.metrics_listen)
        self.refresh_now()
        if refresh_loop:
            self._refresher = asyncio.create_task(self._refresh_loop())
        if lag_probe:
            self._feed_gaps = True
            self._lag_probe = asyncio.create_task(self._probe_loop_lag())
        log.info("proxy on %s -> %s", self.proxy_url, shown_url(self.config.upstream)
                 + (f"; metrics on {self.metrics_url}/metrics" if self.metrics_url else ""))

    def _fit_to_open_files(self) -> None:
        """Lower the connection cap to what the open-file limit holds, saying so once."""
        limit, shares = limits.open_file_limit(), self.connections
        cap, per_client = limits.fit_to_open_files(shares.cap, shares.per_client, limit)
        if cap < shares.cap:
            log.warning("proxy: at most %d connections (%d per client), not %d: the open-file limit (ulimit -n) is"
                        " %d, and each connection takes two (client and upstream) plus %d kept for the rest;"
                        " raise the limit to keep --max-connections", cap, per_client, shares.cap, limit,
                        limits.FD_RESERVE)
            shares.cap, shares.per_client = cap, per_client

    async def stop(self) -> None:
        if self._undo_quiet is not None:
            self._undo_quiet()
            self._undo_quiet = None
        for task in (self._refresher, self._lag_probe):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for server in self._servers:
            server.close()  # stop accepting; the runner's cleanup closes the open connections
        self._servers.clear()
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        if self._pool is not None:
            self._pool.close()

    async def _runner(self, app: web.Application) -> web.AppRunner:
        # handler_cancellation: a client that disconnects cancels its handler, which closes the upstream request.
        # auto_decompress=False: a compressed request body is relayed as it came.
        runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True,
                               auto_decompress=False, shutdown_timeout=1.0, logger=_ServerLog())
        await runner.setup()
        self._runners.append(runner)
        return runner

    async def _serve(self, app: web.Application, listen: str, *, clients: bool = False) -> str:
        host, port = split_listen(listen)
        runner = await self._runner(app)
        if clients:  # the proxy's port: every connection through the limits (agent/proxy/limits.py)
            server = await self._listen_for_clients(runner, host, port)
        else:
            site = web.TCPSite(runner, host, port)
            await site.start()
            server = site._server  # type: ignore[assignment]
        return _url(server.sockets[0].getsockname())  # type: ignore[union-attr]

    def _handler_for(self, runner: web.AppRunner) -> Callable[[str, Any], limits.ProxyHandler]:
        """What a connection's Gate makes of it once admitted: aiohttp's handler, with the port's limits."""
        loop, config = asyncio.get_running_loop(), self.config

        def handler(client: str, shares: Any) -> limits.ProxyHandler:
            return limits.ProxyHandler(runner.server, loop=loop, client=client, shares=shares,
                                       events=self.events, read_header_timeout=config.read_header_timeout,
                                       now=self._now,
                                       keepalive_timeout=config.idle_timeout, access_log=None, logger=_ServerLog(),
                                       auto_decompress=False)

        return handler

    async def _listen_for_clients(self, runner: web.AppRunner, host: str, port: int) -> asyncio.AbstractServer:
        loop, handler = asyncio.get_running_loop(), self._handler_for(runner)
        server = await loop.create_server(lambda: limits.Gate(handler, self.connections, self.events),
                                          host or None, port, backlog=1024)
        self._servers.append(server)
        return server

    def adopt(self, sock: socket.socket, on_close: Callable[[], None]) -> None:
        """Relay a connection another process accepted and admitted (a worker's, agent/proxy/workers.py);
        `on_close` is called once when it ends, however it ends. Only after start(listen=False)."""
        loop, shares = asyncio.get_running_loop(), limits.Handed(on_close, self.connections.cap)
        gate = limits.Gate(self._handler, shares, self.events)
        task = loop.create_task(loop.connect_accepted_socket(lambda: gate, sock))
        self._adopting.add(task)

        def adopted(task: "asyncio.Task[Any]") -> None:
            self._adopting.discard(task)
            if task.cancelled() or task.exception() is not None:  # no transport: nothing will call leave()
                sock.close()
                shares.leave("")

        task.add_done_callback(adopted)

    def _count_event(self, kind: str, reason: str) -> None:
        (self.stats.refused if kind == "refused" else self.stats.bad_requests)[reason] += 1

    def refresh_now(self) -> ClientSnapshot:
        if self.journal is not None:
            self.stats.request_log_lost = self.journal.lost
        try:
            self.snapshot = self.stats.snapshot(self._now())
        except Exception:  # accounting must never take the proxy down
            log.exception("proxy metrics snapshot failed")
            self.stats.accounting_error()
        return self.snapshot

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.refresh)
            self.refresh_now()

    async def _probe_loop_lag(self) -> None:
        """How late the event loop wakes, every LAG_PROBE_SECONDS: the share of a token's gap the loop added
        (ClientGaps.stall_between takes it out). ~100 wake-ups a second, a few microseconds each."""
        now, add = self._now, self.client_gaps.loop_lag.add
        due = now() + LAG_PROBE_SECONDS
        while True:
            await asyncio.sleep(LAG_PROBE_SECONDS)
            t = now()
            add(t, max(0.0, t - due))
            due = t + LAG_PROBE_SECONDS

    # -- apps ------------------------------------------------------------------------------------

    def proxy_app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_buffered_body + 1)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    def metrics_app(self) -> web.Application:
        app = web.Application()
        # the agent's handler (agent/metrics/http.py): gzip, text or OpenMetrics, name[], one render per snapshot
        app.router.add_get("/metrics", metrics_handler(self.registry, same_page_while=lambda: self.snapshot,
                                                       refused=_METRICS_REFUSALS.note, gone=_METRICS_REFUSALS.note))
        app.router.add_get("/-/healthy", self._healthy)
        return app

    async def _healthy(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    # -- the relay -------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        # The client's clock starts at its request's first byte on the socket, not once the request was read.
        start = getattr(request.protocol, "request_arrived", None) or self._now()
        tracker = self._safe_tracker(request, start)
        self.stats.in_flight += 1
        outcome, reason = tr.COMPLETE, None
        try:
            return await self._relay(request, tracker)
        except asyncio.CancelledError:  # the client disconnected (handler_cancellation)
            outcome = tr.CLIENT_DISCONNECTED
            raise
        except _ClientGone as exc:
            outcome = tr.CLIENT_DISCONNECTED
            return exc.response
        except _BadRequest as exc:
            self.events.bad_request(exc.reason, request.remote, exc.why)
            if tracker is not None:
                tracker = self._guard(tracker, tracker.on_response, 400, "text/plain")
            return web.Response(status=400, text=f"rooflight proxy: {exc}\n")
        except _UpstreamFailed as exc:
            outcome, reason = tr.UPSTREAM_ERROR, exc.reason
            if tracker is not None:
                tracker = self._guard(tracker, tracker.on_response, exc.status, "text/plain")
            return web.Response(status=exc.status, text=f"rooflight proxy: upstream {exc.reason} error: {exc.detail}\n")
        except _UpstreamBroke as exc:
            outcome, reason = tr.UPSTREAM_ERROR, exc.reason
            if request.transport is not None:
                request.transport.close()  # flush what was relayed, then close: no terminating chunk
            return exc.response
        finally:
            self.stats.in_flight -= 1
            self._record(tracker, outcome, reason)

    async def _relay(self, request: web.Request, tracker: tr.RequestTracker | None) -> web.StreamResponse:
        assert self._pool is not None, "ProxyServer.start() was not awaited"
        if not request.raw_path.startswith("/"):  # absolute-form (RFC 9112 3.2.2) or asterisk-form
            raise _BadRequest(limits.NOT_A_PATH, "the request target must be a path (origin-form): this is a reverse proxy")
        if _codings(request) - {"chunked"}:  # the chunked framing comes off here; a coding under it would go on unlabelled
            raise _BadRequest(limits.UNSENDABLE, "a request Transfer-Encoding other than chunked cannot be relayed")
        reserved = 0
        try:
            body, reserved = await self._body(request)
            conn, head = await self._send(request, body)
        finally:
            self.body_budget.give(reserved)  # sent (or failed): the body is no longer held
        try:
            response = await self._respond(request, conn, head, tracker)
        except BaseException:
            conn.close()  # an unfinished response closes its connection: the upstream sees the client leave
            raise
        self._pool.put(conn)  # read to the end: the connection goes back to the pool
        return response

    async def _send(self, request: web.Request, body: bytes | AsyncIterator[bytes] | None,
                    ) -> tuple[rl.UpstreamConnection, rl.Head]:
        """Send the request on a pooled connection (once more on a new one when a kept-alive one turns out
        closed before any answer and the body can be sent again); the response's head."""
        assert self._pool is not None
        streamed = body is not None and not isinstance(body, bytes)
        try:
            head_bytes, chunked = self._request_head(request, body)
        except ValueError as exc:  # a target that does not encode back to bytes
            raise _BadRequest(limits.UNSENDABLE, "the request cannot be relayed", exc) from None
        for attempt in (1, 2):
            try:
                conn = await self._pool.get()
            except asyncio.TimeoutError as exc:
                raise _UpstreamFailed(504, "timeout", exc) from None
            except OSError as exc:
                raise _UpstreamFailed(502, "connect", exc) from None
            reused = conn.used
            answer = conn.send(request.method, head_bytes + body if isinstance(body, bytes) else head_bytes)
            try:
                if streamed:
                    async for piece in body:  # type: ignore[union-attr]
                        conn.write(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
                        await conn.drain()
                    if chunked:
                        conn.write(b"0\r\n\r\n")
                return conn, await answer
            except rl.UpstreamBroke as exc:
                conn.close()
                if exc.reason == "disconnected" and reused and not streamed and attempt == 1 and not conn.answered:
                    # a kept-alive connection the upstream had closed: the request never reached it (once a
                    # byte of an answer came, it had: a second copy would run the request twice)
                    continue
                if exc.reason == "unrelayable":
                    _UNRELAYABLE.note(f"the upstream's answer cannot be relayed ({exc})", request.remote)
                    raise _UpstreamFailed(502, "bad_response", exc) from None
                raise _UpstreamFailed(502, "connect", exc) from None
            except ConnectionError as exc:  # the upstream closed while the body was sent
                conn.close()
                raise _UpstreamFailed(502, "connect", exc) from None
            except BaseException:
                conn.close()
                raise
            finally:
                if not answer.done():
                    answer.cancel()  # left before the answer (a body that failed, a cancelled handler)
                elif not answer.cancelled():
                    answer.exception()  # retrieved: a failure was handled above
        raise AssertionError("unreachable")

    def _request_head(self, request: web.Request, body: bytes | AsyncIterator[bytes] | None) -> tuple[bytes, bool]:
        """The request line and headers for the upstream: the client's header lines as they came (names in
        their case), minus hop-by-hop ones; Host the upstream's; the framing this hop needs. And whether
        a streamed body goes chunked."""
        assert self._pool is not None
        raw = request.raw_headers
        named = {t.strip().lower() for k, v in raw if k.lower() == b"connection" for t in v.split(b",")}
        target = self._pool.base_path + request.raw_path.encode("utf-8", "surrogateescape")
        lines = [request.method.encode("ascii") + b" " + target + b" HTTP/1.1", b"Host: " + self._pool.host_header]
        has_length = has_auth = False
        for name, value in raw:
            low = name.lower()
            if low in rl.HOP_BY_HOP or low in named:
                continue
            has_length = has_length or low == b"content-length"
            has_auth = has_auth or low == b"authorization"
            lines.append(name + b": " + value)
        if self.config.upstream_auth is not None and not has_auth:
            lines.append(b"Authorization: " + self.config.upstream_auth.encode("latin-1"))
        chunked = False
        if isinstance(body, bytes) and not has_length:  # the client sent it chunked: read whole, sent with its length
            lines.append(b"Content-Length: %d" % len(body))
        elif body is not None and not isinstance(body, bytes) and not has_length:
            lines.append(b"Transfer-Encoding: chunked")
            chunked = True
        return b"\r\n".join(lines) + b"\r\n\r\n", chunked

    async def _respond(self, request: web.Request, conn: rl.UpstreamConnection, head: rl.Head,
                       tracker: tr.RequestTracker | None) -> web.StreamResponse:
        """The head to the client as its bytes, then the body read by read (relay.UpstreamConnection), waiting
        for the client's buffers to drain whenever they are full."""
        if tracker is not None:
            tracker = self._guard(tracker, tracker.on_response, head.status, head.content_type)
        client = request.transport
        pass_framing = request.version >= HttpVersion11
        keep = (request.keep_alive and pass_framing and head.framing != rl.CLOSE)
        response = _Relayed(head.status, keep)
        if client is None or client.is_closing():
            raise _ClientGone(response)
        reason = safe_reason(head.reason.decode("latin-1")) or ""
        lines = [b"HTTP/1.1 %d %b" % (head.status, reason.encode("latin-1")), *head.lines]
        if pass_framing:
            lines += head.framing_lines
        if not keep:
            lines.append(b"Connection: close")
        client.write(b"\r\n".join(lines) + b"\r\n\r\n")
        holder = [tracker]
        reads = tracker is not None and tracker.reads_bytes  # (a pass-through route: no accounting per read)
        conn.relay_to(client, self._payload_sink(holder) if reads else None, self._now, pass_framing)
        drain, now = request.writer.drain, self._now
        while True:
            try:
                event = await conn.wait()
            except rl.UpstreamBroke:
                raise _UpstreamBroke(response, "disconnected") from None
            except rl.ClientGone:
                raise _ClientGone(response) from None
            if event == rl.DONE:
                return response
            held = now()  # the client's buffers are full: wait until they drain
            try:  # (a client that reads nothing for the idle timeout is closed, as an idle connection is)
                await asyncio.wait_for(drain(), self.config.idle_timeout or None)
            except asyncio.TimeoutError:
                client.abort()
                raise _ClientGone(response) from None
            if client.is_closing():
                raise _ClientGone(response)
            if holder[0] is not None:
                holder[0].on_held(now() - held)
            conn.resume()

    def _payload_sink(self, holder: list[tr.RequestTracker | None]) -> rl.OnPayload:
        """The accounting's view of each read (after it was written to the client), guarded: a failure drops
        this request's accounting, never its bytes."""

        def on_payload(t: float, data: bytes) -> None:
            tracker = holder[0]
            if tracker is None:
                return
            try:
                tracker.on_bytes(t, data)
            except tr.OverBudget:
                holder[0] = self._over_budget(tracker)
            except Exception:
                holder[0] = self._drop(tracker)

        return on_payload

    async def _body(self, request: web.Request) -> tuple[bytes | AsyncIterator[bytes] | None, int]:
        """The body to send and the bytes reserved for it in `body_budget` (the caller gives them back).

        Read whole (its Content-Length kept) when small and the budget has room; else streamed, which
        holds only what aiohttp's flow control lets in, so many large uploads at once stay bounded.
        Either way a body not in after read_body_timeout s of waiting for it closes the connection (`_stream`)."""
        if not request.body_exists:
            return None, 0
        size = request.content_length
        if size is not None and size <= self.config.max_buffered_body and self.body_budget.take(size):
            try:
                return b"".join([chunk async for chunk in self._stream(request)]), size
            except BaseException:
                self.body_budget.give(size)
                raise
        return self._stream(request), 0

    async def _stream(self, request: web.Request) -> AsyncIterator[bytes]:
        """The body's pieces as they come. The waits for the client add up to read_body_timeout s at most
        (past it the connection is closed): a deadline on the whole body, where one per pause let a byte
        every few seconds hold a connection for ever. The time a streamed body waits for the upstream to
        take it (the caller's drain, between pieces) is not the client's and is not counted."""
        content = request.content
        if content.is_eof():  # the whole body came with the headers (a usual request): nothing to wait for
            data = content.read_nowait()
            if data:
                yield data
            return
        readany, left = content.readany, self.config.read_body_timeout
        clock = asyncio.get_running_loop().time
        while True:
            began = clock()
            try:
                data = await asyncio.wait_for(readany(), max(left, 0.0))
            except asyncio.TimeoutError:
                raise self._body_late(request) from None
            except ConnectionError:  # the client reset the connection mid-body: theirs to end, counted, no traceback
                raise self._body_gone(request) from None
            left -= clock() - began
            if not data:
                return
            yield data

    def _body_late(self, request: web.Request) -> "_ClientGone":
        """The client stopped sending its body: count it, close its connection (which cancels this handler and,
        with it, the upstream request), and end the relay."""
        self.events.refused(limits.BODY_TIMEOUT, request.remote,
                            f"the request body not in after {self.config.read_body_timeout:g} s; closed")
        if request.transport is not None:
            request.transport.close()
        return _ClientGone(web.Response(status=408))

    def _body_gone(self, request: web.Request) -> "_ClientGone":
        """The client reset its connection before its body was in: counted, logged one line a minute at most
        (a thousand clients doing it wrote 40,668 lines of tracebacks in 2.2 s), and the relay ends as for a
        client that went away."""
        self.events.refused(limits.BODY_RESET, request.remote, "reset the connection before its request body was in")
        return _ClientGone(web.Response(status=400))

    # -- accounting, guarded ---------------------------------------------------------------------

    def _safe_tracker(self, request: web.Request, start: float) -> tr.RequestTracker | None:
        try:
            header = self.config.tenant_header
            tenant = tenant_key(request.headers.get(header)) if header else None
            return tr.RequestTracker(start, tr.classify_route(request.method, request.path), tenant,
                                     self.client_gaps if self._feed_gaps else None, self.accounting_budget)
        except Exception:
            log.debug("proxy accounting failed at request start", exc_info=True)
            self.stats.accounting_error()
            return None

    def _guard(self, tracker: tr.RequestTracker, method: object, *args: object) -> tr.RequestTracker | None:
        """Call into the tracker; on any failure drop it for the rest of this request."""
        try:
            method(*args)  # type: ignore[operator]
            return tracker
        except Exception:
            return self._drop(tracker)

    def _drop(self, tracker: tr.RequestTracker) -> None:
        """The tracker failed: count it, and relay the rest of this request unaccounted."""
        log.debug("proxy accounting failed mid-request", exc_info=True)
        self.stats.accounting_error()
        self._release(tracker)
        return None

    def _over_budget(self, tracker: tr.RequestTracker) -> None:
        """The accounting's memory budget is spent: relay the rest of this answer unaccounted, and count it."""
        self.stats.over_budget += 1
        self._release(tracker)
        return None

    def _release(self, tracker: tr.RequestTracker) -> None:
        try:
            tracker.release()
        except Exception:
            log.debug("proxy accounting failed to release a request's copies", exc_info=True)

    def _record(self, tracker: tr.RequestTracker | None, outcome: str, reason: str | None) -> None:
        if tracker is None:
            return
        try:
            (self._on_record or self.observe)(tracker.finish(self._now(), outcome, reason))
        except Exception:
            log.debug("proxy accounting failed at request end", exc_info=True)
            self.stats.accounting_error()
        finally:
            self._release(tracker)


async def serve_metrics(server: ProxyServer) -> web.AppRunner:
    """`server`'s /metrics and /-/healthy on the running loop (`rooflight proxy`: not the relay's loop); the
    caller cleans the runner up. A failed bind raises OSError."""
    runner = web.AppRunner(server.metrics_app(), access_log=None, handle_signals=False, shutdown_timeout=1.0,
                           logger=_ServerLog())
    await runner.setup()
    host, port = split_listen(server.config.metrics_listen)
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    log.info("proxy metrics on %s/metrics", _url(runner.addresses[0]))
    return runner


def _codings(request: web.Request) -> set[str]:
    """The transfer codings a request's body came in (empty for none)."""
    return {token.strip().lower() for value in request.headers.getall("Transfer-Encoding", ())
            for token in value.split(",") if token.strip()}


def _url(bound: Any) -> str:
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    return f"http://{shown}:{bound[1]}"


class _ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server log, where a request its parser rejects (it answered 400) is not a traceback but a
    rate-limited line without the request's bytes: anyone can send one, and the log must not fill with them.
    (The proxy's own port counts them first, in limits.ProxyHandler; this is the metrics port's.)"""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})

    def exception(self, msg: object, *args: object, exc_info: object = True, **kwargs: object) -> None:
        if isinstance(exc_info, HttpProcessingError):
            _PARSER_REFUSALS.note(f"not a valid HTTP request ({exc_info.code})", None)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)  # type: ignore[arg-type]


_UNRELAYABLE = limits.RefusalLog("proxy: answered 502 to", logger=log)
_PARSER_REFUSALS = limits.RefusalLog("proxy: answered 400 to", logger=log)
_METRICS_REFUSALS = limits.RefusalLog("proxy: closed a /metrics client at", logger=log)


class _Relayed(web.StreamResponse):
    """What aiohttp gets back for a response the relay wrote itself: already sent, kept alive or not."""

    def __init__(self, status: int, keep_alive: bool) -> None:
        super().__init__(status=status)
        self._eof_sent = True  # prepare() and write_eof() do nothing
        self._keep_alive = keep_alive


class _BadRequest(Exception):
    """The client's request cannot be relayed as sent: it gets 400 (saying why, `detail` included: the
    answer goes to the client who sent it), counted by `reason`; the log gets `why` alone, never the bytes."""

    def __init__(self, reason: str, why: str, detail: BaseException | None = None) -> None:
        super().__init__(f"{why} ({detail})" if detail is not None else why)
        self.reason, self.why = reason, why


class _UpstreamFailed(Exception):
    """No response from the upstream: the client gets 502, or 504 on a timeout."""

    def __init__(self, status: int, reason: str, exc: BaseException) -> None:
        super().__init__(reason)
        self.status, self.reason, self.detail = status, reason, str(exc) or type(exc).__name__


class _ClientGone(Exception):
    """The client stopped reading: nothing more can be sent."""

    def __init__(self, response: web.StreamResponse) -> None:
        super().__init__("client gone")
        self.response = response


class _UpstreamBroke(Exception):
    """The upstream broke off mid-response: the client's connection is cut so it sees the same truncation."""

    def __init__(self, response: web.StreamResponse, reason: str) -> None:
        super().__init__(reason)
        self.response, self.reason = response, reason
