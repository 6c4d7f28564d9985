"""The agent's HTTP face: /metrics, health and readiness, the status page (agent/serve/page.py), and a JSON snapshot.

Every handler reads the current frozen Snapshot; none waits on a source. Engine targets come only from
configuration: no request parameter can make the agent fetch a URL.

What a client can hold is bounded (docs/security.md): a request line of MAX_LINE_SIZE bytes (414 past
it), MAX_HEADERS headers of MAX_FIELD_SIZE bytes each (431), a body of 64 KiB (413), the request's
headers within ServerLimits.read_header_timeout of its first byte (or of the connection, or of the TLS
handshake, itself bounded by that timeout), ServerLimits.max_connections open connections counted from
accept, TLS handshakes in progress included (503 past it, or a close on a TLS port), and an idle keep-alive
connection for ServerLimits.idle_timeout. Refusals are logged as one line at most every
REFUSAL_LOG_SECONDS, with a count and the client address, never the request's bytes.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import socket
import ssl
from collections import Counter
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler
from prometheus_client.registry import Collector

from rooflight.agent import __version__
from rooflight.agent.errors import ConfigError
from rooflight.agent.metrics import family
from rooflight.agent.metrics.exposition import GpuRow, api_values, registry_for
from rooflight.agent.metrics.http import metrics_handler
from rooflight.agent.proxy import limits
from rooflight.agent.proxy.config import ProxyConfig
from rooflight.agent.proxy.limits import RefusalLog
from rooflight.agent.proxy.server import ProxyServer
from rooflight.agent.proxy.apart import ProxyApart
from rooflight.agent.serve.page import add_status_routes
from rooflight.agent.serve.webconfig import WEB_HEADERS
from rooflight.agent.config.urls import public_url as _public_url
from rooflight.agent.config.values import split_listen
from rooflight.agent.signals.detectors import detectors
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.metrics.snapshot import Snapshot

log = logging.getLogger("rooflight")

AGENT_KEY = web.AppKey("agent", Agent)


def build_app(agent: Agent, *, manage_agent: bool = True, collectors: Sequence[Collector] = (),
              **app_kwargs: Any) -> web.Application:
    """The agent's app; `collectors` join its /metrics (the proxy's rooflight_client_* under `rooflight run`)."""
    app = web.Application(client_max_size=64 * 1024, **app_kwargs)
    app[AGENT_KEY] = agent
    registry = registry_for(lambda: agent.snapshot)
    for collector in collectors:
        registry.register(collector)
    app.router.add_get("/metrics", metrics_handler(registry, same_page_while=None if collectors else lambda: agent.snapshot,
                                                   refused=REFUSALS.note, gone=GONE.note))
    add_status_routes(app, agent)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", ready)
    app.router.add_get("/api/v1/snapshot", snapshot_json)
    app.on_response_prepare.append(_security_headers)
    if manage_agent:
        app.cleanup_ctx.append(_agent_lifecycle)
    return app


# On every answer (a handler's own CSP, the status page's, wins; so does a web config's http_server_config):
# nothing the agent serves runs script or may be framed, and no browser guesses a type the agent did not send.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    for name, value in request.get(WEB_HEADERS, {}).items():  # the web config's, on streamed answers too
        response.headers[name] = value
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


async def _agent_lifecycle(app: web.Application) -> AsyncIterator[None]:
    agent = app[AGENT_KEY]
    await agent.start()
    yield
    await agent.stop()


async def healthy(request: web.Request) -> web.Response:
    return web.Response(text="OK\n")


async def ready(request: web.Request) -> web.Response:
    snap = request.app[AGENT_KEY].snapshot
    if snap.created == 0.0:
        return web.Response(status=503, text="starting\n")
    return web.Response(text="ready\n")


def public_url(url: str) -> str:
    """A URL without user:password, query or fragment, for anything the agent shows."""
    return _public_url(url)


def snapshot_dict(snap: Snapshot) -> dict[str, Any]:
    """The snapshot as plain data: only what /metrics shows, in a shape a script can read. Each value is a
    family's (agent/metrics/names.py: the families that name an `api` field), as derived."""
    return {
        "created": snap.created,
        "health": [{"source": h.source, "target": h.target, **api_values(family.HEALTH, h)} for h in snap.health],
        "targets": [_target_dict(t) for t in snap.targets],
        "gpus": [
            {"index": d.index, "uuid": d.uuid, "name": d.name, **api_values(family.GPU, GpuRow(d, ()))}
            for d in (snap.gpu.devices if snap.gpu else ())
        ],
    }


def _target_dict(t: Any) -> dict[str, Any]:
    c = t.constants
    return {
        "name": t.name,
        "engine": t.engine,
        "gpu_profile": c.gpu_key if c else None,
        "gpu_profile_source": c.gpu_source if c else None,
        "tensor_parallel_size": c.tensor_parallel_size if c else None,
        "model": c.model.name if c and c.model else None,
        "model_source": t.model_source,
        "series": [
            {
                "model": v.series.model,
                "rank": v.series.rank,
                **api_values(family.SERIES, v),
                "windows": [{"window": w.window, "seconds": w.seconds, **api_values(family.WINDOW, w)}
                            for w in v.windows],
                "verdicts": _verdicts_dict(v.verdicts),
            }
            for v in t.series
        ],
    }


def _verdicts_dict(verdicts: Any) -> dict[str, Any] | None:
    """Each detector's verdict, followed by the numbers it carries (agent/signals/detectors/)."""
    if verdicts is None:
        return None
    keys = (k for d in detectors() for k in (d.key, *(v.attr for v in d.values)))
    return {k: getattr(verdicts, k, None) for k in keys}


async def snapshot_json(request: web.Request) -> web.Response:
    return web.json_response(snapshot_dict(request.app[AGENT_KEY].snapshot))


# Request limits on the agent's own endpoints: nothing it serves needs a long URL or many headers.
MAX_LINE_SIZE = 4096
MAX_FIELD_SIZE = 4096
MAX_HEADERS = 64


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """How long a client may take and how many may connect (Go's ReadHeaderTimeout, IdleTimeout, a cap)."""

    read_header_timeout: float = 10.0
    max_connections: int = 256
    idle_timeout: float = 120.0  # a keep-alive connection between requests (Prometheus scrapes every 15-60 s)


REFUSALS = RefusalLog()
# Clients that reset before their /metrics answer went out: anyone can make thousands a second.
GONE = RefusalLog("a client went away at", kind="such client(s)")
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 21\r\n"
         + "".join(f"{k}: {v}\r\n" for k, v in SECURITY_HEADERS.items()).encode()
         + b"Connection: close\r\n\r\ntoo many connections\n")


class _Handler(limits.HeaderDeadline, RequestHandler):
    """aiohttp's connection handler with a read-header timeout, a connection cap and quiet refusals."""

    __slots__ = ("_limits", "_deadline", "_busy", "_waiting", "_first_line", "_line_done", "_made")

    def __init__(self, manager: Any, *, loop: asyncio.AbstractEventLoop, limits: ServerLimits, **kwargs: Any) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self._limits = limits
        self._deadline: asyncio.TimerHandle | None = None
        self._busy = False
        self._waiting = False  # waiting out a delayed 429 (webconfig.py): nothing owed, a place to give up
        self._first_line = 0  # bytes of the current request line so far: tells 414 from 431
        self._line_done = False
        self._made = False  # a TLS handshake that fails reports a lost connection that was never made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._made = True
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self._busy:
            self._arm()
            if not self._line_done:
                newline = data.find(b"\n")
                self._first_line += len(data) if newline < 0 else newline
                self._line_done = newline >= 0
        super().data_received(data)

    @property
    def in_request(self) -> bool:
        """Handling a request (its answer may still be going out): not a connection to close for room.

        A client waiting out its delayed 429 is not: a flood that keeps every connection in that wait
        would otherwise hold the whole cap against everyone else's logins."""
        return self._busy and not self._waiting

    def set_waiting(self, waiting: bool) -> None:
        """Mark the current request as only waiting out a delay (webconfig.LIMITED_DELAY): evictable."""
        self._waiting = waiting

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        if self._made:
            super().connection_lost(exc)

    def _request_done(self) -> None:
        self._waiting, self._first_line, self._line_done = False, 0, False

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        status, reason = self._refusal(exc)
        REFUSALS.note(f"{status} {reason}", request.remote)
        response = web.Response(status=status, text=f"{reason}\n", headers=SECURITY_HEADERS)
        response.force_close()
        return response

    def _refusal(self, exc: HttpProcessingError) -> tuple[int, str]:
        if isinstance(exc, LineTooLong):
            if self._first_line > MAX_LINE_SIZE:
                return 414, f"request line over {MAX_LINE_SIZE} bytes"
            return 431, f"a header over {MAX_FIELD_SIZE} bytes"
        if "too many headers" in str(exc).lower():
            return 431, f"more than {MAX_HEADERS} headers"
        return 400, "not a valid HTTP request"

    def _header_seconds(self) -> float:
        return self._limits.read_header_timeout

    def _headers_late(self) -> None:
        REFUSALS.note(f"no complete request headers within {self._limits.read_header_timeout:g} s; closed",
                      _peer(self.transport))
        self.force_close()


class OpenSockets:
    """The connections a listener holds, counted from accept (before any TLS handshake) to the socket's close.

    Counting the connections aiohttp knows of is not enough: with TLS it learns of one only after the
    handshake, so clients that connect and never handshake were uncounted and could use up every file
    descriptor. A closed socket is dropped lazily, when the count reaches the cap.

    At the cap, places are shared by client address: a newcomer takes the place of the newest connection
    not in a request (idle, trickling its headers or its TLS handshake, or waiting out a delayed 429) of
    the address holding the most, when that address holds at least two more than the newcomer's; otherwise
    it is refused. So one address re-opening hundreds of tricklers costs its own connections, and Prometheus
    still gets in; and the newest goes, not the oldest: an address's long-lived keep-alive is a scraper's
    (an attacker behind the same NAT as Prometheus would otherwise have its session closed, then its
    reconnect refused), while tricklers are new."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._open: dict[asyncio.BaseTransport, str] = {}  # transport -> client address, oldest first
        self._handlers: dict[asyncio.BaseTransport, _Handler] = {}

    def admit(self, transport: asyncio.BaseTransport) -> bool:
        """Count `transport` and say yes, or say no when `cap` sockets are still open and none can give way."""
        client = _peer(transport) or "?"
        if len(self._open) >= self.cap:
            self._prune()
        if len(self._open) >= self.cap and not self._make_room(client):
            return False
        self._open[transport] = client
        return True

    def serving(self, transport: asyncio.BaseTransport, handler: _Handler) -> None:
        """`transport` is now served by `handler` (after the TLS handshake, with TLS): it can tell a request."""
        if transport in self._open:
            self._handlers[transport] = handler

    def _prune(self) -> None:
        self._open = {t: c for t, c in self._open.items() if _holds_socket(t)}
        self._handlers = {t: h for t, h in self._handlers.items() if t in self._open}

    def _make_room(self, client: str) -> bool:
        held = Counter(self._open.values())
        top, most = held.most_common(1)[0]
        if most < held.get(client, 0) + 2:
            return False  # nobody holds more than the newcomer would: the cap is shared fairly already
        for transport, owner in reversed(self._open.items()):  # newest first: keep the long-lived sessions
            handler = self._handlers.get(transport)
            if owner == top and (handler is None or not handler.in_request):
                del self._open[transport]
                self._handlers.pop(transport, None)
                REFUSALS.note(f"over {self.cap} open connections; closed one of the {most} held by this address"
                              " (not in a request) to let another address in", top)
                transport.abort()  # type: ignore[attr-defined]
                return True
        return False

    def __len__(self) -> int:
        self._prune()
        return len(self._open)


def _holds_socket(transport: asyncio.BaseTransport) -> bool:
    sock = transport.get_extra_info("socket")
    return sock is not None and sock.fileno() >= 0


_HANDSHAKES: set[asyncio.Task[None]] = set()


class _Gate(asyncio.Protocol):
    """First protocol of every accepted connection: admits it against the cap, then hands it to a _Handler,
    through a TLS handshake bounded by the read-header timeout when the listener has TLS."""

    def __init__(self, make: Callable[[], _Handler], sockets: OpenSockets, ssl_context: Any,
                 handshake_timeout: float) -> None:
        self._make, self._sockets, self._ssl = make, sockets, ssl_context
        self._handshake_timeout = handshake_timeout
        self._lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._sockets.admit(transport):
            REFUSALS.note(f"over {self._sockets.cap} open connections (max_connections);"
                          + (" closed" if self._ssl is not None else " answered 503"), _peer(transport))
            if self._ssl is None:
                transport.write(_BUSY)  # type: ignore[attr-defined]
                transport.close()
            else:  # a plain-text answer means nothing to a TLS client
                transport.abort()  # type: ignore[attr-defined]
            return
        if self._ssl is None:
            handler = self._make()
            transport.set_protocol(handler)
            self._sockets.serving(transport, handler)
            handler.connection_made(transport)
            return
        transport.pause_reading()  # type: ignore[attr-defined]  # nothing reaches the gate before the handshake
        task = asyncio.get_running_loop().create_task(self._handshake(transport))
        _HANDSHAKES.add(task)  # the loop holds tasks weakly
        task.add_done_callback(_HANDSHAKES.discard)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._lost = True

    async def _handshake(self, transport: asyncio.BaseTransport) -> None:
        if self._lost or transport.is_closing():
            return
        handler = self._make()
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(transport, handler, self._ssl, server_side=True,  # type: ignore[arg-type]
                                       ssl_handshake_timeout=self._handshake_timeout or None)
        except (OSError, EOFError, ssl.SSLError, asyncio.TimeoutError, ConnectionError, RuntimeError):
            transport.abort()  # type: ignore[attr-defined]  # start_tls closed it already; make sure
            return
        if tls is None:
            transport.abort()  # type: ignore[attr-defined]
            return
        self._sockets.serving(transport, handler)
        handler.connection_made(tls)


ACCEPT_FAILURES = RefusalLog()


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """The proxy's handler (agent/proxy/limits.py), logging in this server's ACCEPT_FAILURES."""
    return limits.quiet_accept_errors(loop, lambda: ACCEPT_FAILURES,
                                      "raise the open-file limit (ulimit -n) above max_connections or lower it")


def _peer(transport: asyncio.BaseTransport) -> str | None:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, (tuple, list)) and peer else None


async def listen(runner: web.AppRunner, host: str, port: int, *, ssl_context: Any = None,
                 limits: ServerLimits = ServerLimits()) -> asyncio.AbstractServer:
    """Bind host:port for `runner` (set up or not yet) with the limits above; not yet serving.

    Call server.start_serving() once runner.setup() is done. A bind that fails raises ConfigError
    saying what to change (port in use, privileged port, address not on this machine)."""
    loop = asyncio.get_running_loop()
    sockets = OpenSockets(limits.max_connections)

    def handler() -> _Handler:
        return _Handler(runner.server, loop=loop, limits=limits, keepalive_timeout=limits.idle_timeout,
                        access_log=None, max_line_size=MAX_LINE_SIZE, max_field_size=MAX_FIELD_SIZE,
                        max_headers=MAX_HEADERS)

    def gate() -> asyncio.Protocol:
        return _Gate(handler, sockets, ssl_context, limits.read_header_timeout)

    try:
        return await loop.create_server(gate, host or None, port, backlog=128, start_serving=False)
    except OSError as exc:
        raise ConfigError(bind_error(exc, host, port)) from None


def bind_error(exc: OSError, host: str, port: int) -> str:
    """What to do about a failed bind of host:port, for the user who gave --listen."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if isinstance(exc, socket.gaierror):
        return f"listen address {shown}: cannot resolve {host!r}; write an IP address, e.g. 127.0.0.1:{port}"
    if exc.errno == errno.EADDRINUSE:
        return f"listen address {shown}: the port is already in use; stop the other process or choose another port"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (f"listen address {shown}: not allowed to listen there (ports below 1024 need privileges);"
                " choose a port of 1024 or more, e.g. 9746")
    if exc.errno == errno.EADDRNOTAVAIL:
        return (f"listen address {shown}: {host} is not an address of this machine; use 127.0.0.1,"
                " 0.0.0.0 (every interface) or one of this machine's addresses")
    return f"listen address {shown}: cannot listen there ({exc.strerror or exc})"


async def start_proxy(proxy: ProxyApart) -> None:
    """Start the client-side proxy's relay in a process of its own (scrapes here never wait for its streams'
    tokens, nor its tokens for the GIL the agent's pages hold), without a /metrics port of its own; a failed
    bind is a ConfigError."""
    try:
        await proxy.start()
    except OSError as exc:
        host, port = split_listen(proxy.server.config.listen)
        raise ConfigError(f"proxy_listen: {bind_error(exc, host, port)}") from None


async def serve(agent: Any, host: str, port: int, *, security: Any = None,
                limits: ServerLimits = ServerLimits(), proxy: ProxyConfig | None = None) -> None:
    """Serve the agent until SIGINT/SIGTERM; `security` (webconfig.WebSecurity) adds TLS and auth.

    With `proxy` (`rooflight run --proxy-listen`), the client-side proxy relays in a process of its own
    (agent/proxy/apart.py) and its rooflight_client_* metrics are on this /metrics; TLS, auth and
    the limits here are the agent's port's only, the proxy relays its clients' requests as they come
    (docs/proxy.md).
    Both addresses are bound before the agent starts, so a bad --listen or --proxy-listen stops the
    start (ConfigError)."""
    middlewares: list[Callable[..., Awaitable[web.StreamResponse]]] = (
        [security.middleware] if security is not None else [])
    ssl_context = security.ssl_context if security is not None else None
    proxy_server = ProxyServer(proxy) if proxy is not None else None
    if proxy_server is not None and proxy.name:  # it fronts one of the agent's targets: its gaps
        agent.use_client_gaps(proxy.name, proxy_server.client_gaps)
    elif proxy_server is not None:
        log.warning("the proxy's upstream %s is none of the targets' host:port: its client series carry "
                    "target=%r, and head-of-line is judged by the engines' ITL buckets, not the proxy's gaps",
                    public_url(proxy.upstream), proxy.target)
    collectors = [proxy_server.collector()] if proxy_server is not None else []
    proxy_apart = ProxyApart(proxy_server) if proxy_server is not None else None
    runner = web.AppRunner(build_app(agent, middlewares=middlewares, collectors=collectors), access_log=None,
                           handle_signals=False, keepalive_timeout=limits.idle_timeout, max_line_size=MAX_LINE_SIZE,
                           max_field_size=MAX_FIELD_SIZE, max_headers=MAX_HEADERS)
    server = await listen(runner, host, port, ssl_context=ssl_context, limits=limits)
    undo_quiet = quiet_accept_errors(asyncio.get_running_loop())
    try:
        if proxy_apart is not None:
            await start_proxy(proxy_apart)
        await runner.setup()
        await server.start_serving()
        if security is not None:
            security.install_sighup(asyncio.get_running_loop())
        scheme = "https" if ssl_context else "http"
        shown = f"[{host}]" if ":" in host else host
        bound = server.sockets[0].getsockname()[1] if server.sockets else port
        print(f"rooflight {__version__}: serving {scheme}://{shown}:{bound}/metrics", flush=True)
        if proxy_server is not None:
            print(f"rooflight {__version__}: proxy on {proxy_server.proxy_url} -> {public_url(proxy_server.config.upstream)}",
                  flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        server.close()
        try:
            if proxy_apart is not None:
                await proxy_apart.stop()
        finally:
            await runner.cleanup()
            undo_quiet()
