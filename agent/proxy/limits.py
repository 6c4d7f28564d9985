"""What a client can hold on the proxy's port: time to send its headers, time idle, and connections.

Anyone who reaches the port can open connections and send nothing, or headers a byte at a time: without
bounds 1,000 header tricklers and 3,000 idle sockets were held at 200 s. Here:

- a request's headers must arrive within `read_header_timeout` s of its first byte (or of the connection,
  for the first request), and its body within `read_body_timeout` s of waiting for it in all (server.py
  reads it so; a body announced and never sent held its connection, and an upstream one, forever, and
  one timed per pause was held by a byte every few seconds); the response takes as long as it takes (a
  queued LLM request may wait minutes for its first token);
- a keep-alive connection idle between requests is closed after `idle_timeout` s;
- at most `max_connections` connections are open at once, and one client (an IP address) holds at most
  `max_connections_per_client` of them, so one client flooding the port leaves the rest to the others.
  A connection past either is answered 503 and closed.

Refusals and bad requests are counted (rooflight_client_connections_refused_total,
rooflight_client_bad_requests_total) and logged as one line per REFUSAL_LOG_SECONDS at most, with a count
and the client's address, never the bytes it sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger("rooflight.proxy")

REFUSAL_LOG_SECONDS = 60.0
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 42\r\n"
        b"Connection: close\r\n\r\nrooflight proxy: too many open connections\n")

# Refusal and bad-request reasons, the label values of the two counters.
MAX_CONNECTIONS = "max_connections"
PER_CLIENT = "per_client"
HEADER_TIMEOUT = "header_timeout"
BODY_TIMEOUT = "body_timeout"  # a request's body was not in after read_body_timeout s of waiting for it
BODY_RESET = "body_reset"  # the client reset its connection before its request's body was in
MALFORMED = "malformed"  # aiohttp's parser refused it (answered 400)
NOT_A_PATH = "target"  # the request target is not a path this reverse proxy can relay
UNSENDABLE = "unsendable"  # a target or header the proxy's HTTP client will not send on


class RefusalLog:
    """One log line per `every` s at most, counting the refusals it stood for: anyone who can reach a port
    can make the proxy or the agent refuse requests, and that must not fill the logs. The line names the
    client's address and our own words for the refusal, never what the client sent. Shared by the proxy and
    the agent's server (agent/serve imports it: the proxy sits lower)."""

    def __init__(self, what: str = "refused a client at", every: float = REFUSAL_LOG_SECONDS,
                 clock: Callable[[], float] = time.monotonic, *, kind: str = "refusal(s)",
                 logger: logging.Logger | None = None) -> None:
        self._what, self._every, self._clock, self._kind = what, every, clock, kind
        self._log = logger or logging.getLogger("rooflight")  # the proxy's pass their own
        self._last: float | None = None
        self._held = 0
        self.total = 0  # every note since the start, logged or not

    def note(self, why: str, client: str | None) -> None:
        now = self._clock()
        self.total += 1
        if self._last is not None and now - self._last < self._every:
            self._held += 1
            return
        more = f" (and {self._held} other {self._kind} since the last such line)" if self._held else ""
        self._log.warning("%s %s: %s%s", self._what, client or "?", why, more)
        self._last, self._held = now, 0


class ConnectionShares:
    """Open connections, in total and per client address: admit() says yes or why not, leave() forgets one."""

    def __init__(self, cap: int, per_client: int) -> None:
        self.cap, self.per_client = cap, per_client
        self.total = 0
        self._by_client: dict[str, int] = {}

    def admit(self, client: str) -> str | None:
        """Count one more connection of `client` and return None, or the reason it is refused."""
        if self.total >= self.cap:
            return MAX_CONNECTIONS
        held = self._by_client.get(client, 0)
        if held >= self.per_client:
            return PER_CLIENT
        self.total += 1
        self._by_client[client] = held + 1
        return None

    def leave(self, client: str) -> None:
        self.total -= 1
        held = self._by_client[client] - 1
        if held:
            self._by_client[client] = held
        else:
            del self._by_client[client]


class Handed:
    """The shares of one connection a worker was handed (agent/proxy/workers.py): the parent admitted it
    against the cap and the per-client share of every worker together, so here it is only let in, and its
    end is told back (`on_close`, once) for the parent to count it out."""

    __slots__ = ("cap", "per_client", "_on_close")

    def __init__(self, on_close: Callable[[], None], cap: int) -> None:
        self.cap, self.per_client, self._on_close = cap, cap, on_close

    def admit(self, client: str) -> str | None:
        return None

    def leave(self, client: str) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()


class Events:
    """Where the port's refusals go: counted by the caller's `count(kind, reason)`, logged rate-limited."""

    def __init__(self, count: Callable[[str, str], None]) -> None:
        self._count = count
        self._refused = RefusalLog("proxy: refused a connection from", logger=log)
        self._bad = RefusalLog("proxy: answered 400 to", logger=log)

    def refused(self, reason: str, client: str | None, why: str) -> None:
        self._count("refused", reason)
        self._refused.note(why, client)

    def bad_request(self, reason: str, client: str | None, why: str) -> None:
        self._count("bad_request", reason)
        self._bad.note(why, client)


class HeaderDeadline:
    """Go's ReadHeaderTimeout for an aiohttp RequestHandler, shared by the proxy's port and the agent's own:
    `_arm()` when a connection opens or a request ends, `_disarm()` once a request's headers are in. The
    handler declares the `_deadline` and `_busy` slots, and says its timeout (`_header_seconds`) and what a
    late client gets (`_headers_late`: counted, logged by its own refusal log, closed)."""

    __slots__ = ()
    _deadline: asyncio.TimerHandle | None
    _busy: bool

    def _header_seconds(self) -> float:
        raise NotImplementedError

    def _headers_late(self) -> None:
        raise NotImplementedError

    def _arm(self) -> None:
        seconds = self._header_seconds()
        if self._deadline is None and seconds > 0:
            self._deadline = asyncio.get_running_loop().call_later(seconds, self._deadline_passed)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        if self._busy or getattr(self, "transport", None) is None:
            return
        self._headers_late()

    async def _handle_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        """A request's headers are in: no deadline while it is handled; the next one's starts after."""
        self._busy = True
        self._disarm()
        try:
            return await super()._handle_request(request, *args, **kwargs)  # type: ignore[misc]
        finally:
            self._busy = False
            self._request_done()

    def _request_done(self) -> None:
        """What the handler forgets between requests (nothing here)."""


class ProxyHandler(HeaderDeadline, RequestHandler):
    """aiohttp's connection handler with a read-header timeout, a place in ConnectionShares, and bad
    requests counted and answered without a log line each."""

    __slots__ = ("_client", "_shares", "_events", "_header_timeout", "_deadline", "_busy", "_now", "_first_byte",
                 "request_arrived", "_payload")

    def __init__(self, manager: Any, *, client: str, shares: ConnectionShares | Handed, events: Events,
                 read_header_timeout: float, now: Callable[[], float] = time.monotonic, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._client, self._shares, self._events = client, shares, events
        self._header_timeout = read_header_timeout
        self._deadline: asyncio.TimerHandle | None = None
        self._busy = False
        self._now = now
        self._first_byte: float | None = None  # when the next request's first byte reached the socket
        # When the request being handled began to arrive (its first byte on this socket, read by `now`): a
        # client's TTFT includes the time it took to send its request, and the proxy's clock starts there.
        self.request_arrived: float | None = None
        self._payload: Any = None  # the last request's body (a StreamReader): bytes of it are not a new request

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        # The rest of a body the handler did not read (aiohttp reads it after the answer) is not the next
        # request: it must neither start that request's clock nor its header deadline. Nor is the empty
        # call aiohttp makes when it resumes reading.
        if data and not self._busy and (self._payload is None or self._payload.is_eof()):
            if self._first_byte is None:
                self._first_byte = self._now()
            self._arm()
        super().data_received(data)

    async def _handle_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        self.request_arrived, self._first_byte = self._first_byte, None
        self._payload = request.content
        result = await super()._handle_request(request, *args, **kwargs)
        # The relay writes to the socket itself, and an answer that ends within one upstream read never
        # waits for the client: without this, a client that pipelines requests and reads nothing had every
        # one relayed and its answers held (20,000 small ones: ~400 MB). The next request waits until the
        # client has read this answer down to the transport's mark (busy meanwhile: not yet the next
        # request's clock or header deadline). A client that reads nothing for the idle timeout meanwhile is
        # closed, as an idle connection is.
        self._busy = True
        try:
            await asyncio.wait_for(self._drain_helper(), self._keepalive_timeout or None)
        except asyncio.TimeoutError:
            transport = self.transport
            self.force_close()  # (its close would wait to send what is held, to a client that reads nothing)
            if transport is not None:
                transport.abort()  # what it holds unsent is dropped
        except ConnectionError:
            pass  # gone: aiohttp ends the connection
        finally:
            self._busy = False
        return result

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        if self._shares is not None:
            self._shares.leave(self._client)
            self._shares = None  # type: ignore[assignment]  # counted once
        super().connection_lost(exc)

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> Any:
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        from aiohttp import web  # aiohttp.web imports this module's base: import late, once, here

        self._events.bad_request(MALFORMED, self._client, "not a valid HTTP request")
        response = web.Response(status=400, text="rooflight proxy: not a valid HTTP request\n")
        response.force_close()
        return response

    def _header_seconds(self) -> float:
        return self._header_timeout

    def _headers_late(self) -> None:
        self._events.refused(HEADER_TIMEOUT, self._client,
                             f"no complete request headers within {self._header_timeout:g} s; closed")
        self.force_close()


class Gate(asyncio.Protocol):
    """The first protocol of every accepted connection: admits it against ConnectionShares and hands it to a
    ProxyHandler, or answers 503 and closes it."""

    def __init__(self, make: Callable[[str, Any], ProxyHandler], shares: ConnectionShares | Handed,
                 events: Events) -> None:
        self._make, self._shares, self._events = make, shares, events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else "?"
        refused = self._shares.admit(client)
        if refused is not None:
            limit = self._shares.cap if refused == MAX_CONNECTIONS else self._shares.per_client
            self._events.refused(refused, client, f"over {limit} open connections ({refused}); answered 503")
            transport.write(BUSY)  # type: ignore[attr-defined]
            transport.close()
            return
        handler = self._make(client, self._shares)
        transport.set_protocol(handler)
        handler.connection_made(transport)


# -- the open-file limit ---------------------------------------------------------------------------------

FD_RESERVE = 256  # open files kept for everything but the relay: the agent's port and scrapes, logs, NVML
_ACCEPT_FAILED = "socket.accept() out of system resource"
ACCEPT_FAILURES = RefusalLog("proxy: cannot accept", logger=log)


def fit_to_open_files(cap: int, per_client: int, soft_limit: int) -> tuple[int, int]:
    """(cap, per_client) lowered so that each connection's two sockets (the client's and the upstream's)
    plus FD_RESERVE fit in `soft_limit` open files (RLIMIT_NOFILE; negative means unlimited). Past the
    limit asyncio's accept fails in a loop, a traceback each (103,197 in 3 s at `ulimit -n 1024`)."""
    if soft_limit < 0:
        return cap, per_client
    fits = max(1, (soft_limit - FD_RESERVE) // 2)
    if cap <= fits:
        return cap, per_client
    return fits, max(1, min(per_client, fits * per_client // cap))


def open_file_limit() -> int:
    """The soft RLIMIT_NOFILE, -1 when unlimited or unknown."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return -1
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return -1 if soft == resource.RLIM_INFINITY else int(soft)


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, failures: Callable[[], RefusalLog] | None = None,
                        advice: str = "raise the open-file limit (ulimit -n) or lower --max-connections",
                        ) -> Callable[[], None]:
    """Log asyncio's "socket.accept() out of system resource" (a traceback per failed accept, thousands a
    second when the open files run out) as one line a minute in `failures()` (this module's ACCEPT_FAILURES
    by default); anything else as before. Returns the undo. Each loop needs its own: the agent's server, the
    proxy's relay and the standalone proxy's /metrics."""
    previous = loop.get_exception_handler()
    failures = failures or (lambda: ACCEPT_FAILURES)

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if str(context.get("message", "")).startswith(_ACCEPT_FAILED):
            exc = context.get("exception")
            why = getattr(exc, "strerror", None) or type(exc).__name__
            failures().note(f"cannot accept new connections ({why}); {advice}", "new connections")
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)
    return lambda: loop.set_exception_handler(previous)
