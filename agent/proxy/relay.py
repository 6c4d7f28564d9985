"""The upstream side of the relay at the protocol level: one asyncio.Protocol per upstream connection, whose
`data_received` writes each read from the upstream straight to the client's transport, then reads it.

Why not aiohttp's client (as before): per chunk it decoded the chunked framing into a StreamReader, woke the
handler's coroutine (a future per read), and aiohttp's server encoded the framing again, about 24 us of CPU
a chunk on the bench's fake upstream (bench/bench_proxy.py, 64 x 100 chunks/s; docs/proxy.md "Cost"). Here a
read costs one callback: the bytes go to the client as they came (framing included), and only then does the
accounting see them (`on_payload`, the chunk bodies with the framing taken off). The response's status line
and headers are relayed as their bytes (names in their own case), minus the hop-by-hop ones.

Flow control: when the client's transport holds more than `HIGH_WATER` bytes unsent, the upstream's reading
is paused until the client's protocol says its buffers drained (the handler waits for it), so a slow
client never makes the proxy buffer more than about one read past the mark.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import time
from typing import Callable
from urllib.parse import urlsplit

DNS_TTL = 60.0  # seconds a resolved upstream host name is kept
HIGH_WATER = 64 * 1024  # bytes the client's transport may hold unsent before the upstream is paused
MAX_HEAD = 64 * 1024  # an upstream status line and headers larger than this are not relayed (502)
MAX_CHUNK_LINE = 4096  # a chunk-size line (or trailer line) longer than this is a broken upstream

# RFC 9110 7.6.1: meaningful for one connection only, never forwarded. Transfer-Encoding is handled apart:
# the client's hop gets the upstream's chunked framing as it came.
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization",
                        b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade", b"host",
                        b"expect"})
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")

# How a response body ends.
NONE, LENGTH, CHUNKED, CLOSE = "none", "length", "chunked", "close"
PAUSED, DONE = "paused", "done"  # what the handler is woken for


class UpstreamBroke(Exception):
    """The upstream closed or sent what cannot be relayed; `reason` is the metrics label
    ("disconnected" mid-body, "unrelayable" for a head that cannot be parsed)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class ClientGone(Exception):
    """The client's connection closed while its response was relayed."""


class Head:
    """A response's status line and headers, as relayed: raw header lines minus the hop-by-hop ones."""

    __slots__ = ("status", "reason", "lines", "content_type", "framing", "length", "close", "framing_lines")

    def __init__(self, status: int, reason: bytes, lines: list[bytes], content_type: str, framing: str,
                 length: int, close: bool, framing_lines: list[bytes]) -> None:
        self.status, self.reason, self.lines, self.content_type = status, reason, lines, content_type
        self.framing, self.length, self.close = framing, length, close
        self.framing_lines = framing_lines  # the Transfer-Encoding lines, for a client that gets the same framing


def parse_head(block: bytes, method: str) -> Head:
    """The response head (without its final blank line); ValueError when it cannot be relayed."""
    status_line, *raw = block.split(b"\r\n")
    version, _, rest = status_line.partition(b" ")
    code, _, reason = rest.partition(b" ")
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit() or code < b"100":
        raise ValueError("not an HTTP/1.x status line")
    status = int(code)
    if status == 101:  # the proxy never relays Upgrade: past a 101 the bytes are another protocol's
        raise ValueError("a protocol switch the proxy did not ask for")
    lines: list[bytes] = []
    named: set[bytes] = set()
    content_type, lengths, encodings, close = "", set(), [], version == b"HTTP/1.0"
    te_lines: list[bytes] = []
    for line in raw:
        name, colon, value = line.partition(b":")
        if not colon or not name or any(c not in _TOKEN for c in name):
            raise ValueError("a header line without a valid name")
        if b"\n" in value or b"\x00" in value or b"\r" in value:
            raise ValueError("a control character in a header value")
        low, value = name.lower(), value.strip(b" \t")
        if low == b"connection":
            tokens = {t.strip().lower() for t in value.split(b",")}
            named |= tokens
            close = b"close" in tokens or (close and b"keep-alive" not in tokens)
        elif low == b"transfer-encoding":
            encodings += [t.strip().lower() for t in value.split(b",")]
            te_lines.append(line)
        elif low == b"content-length":
            lengths.add(value)
        elif low == b"content-type":
            content_type = value.decode("latin-1")
        if low not in HOP_BY_HOP:
            lines.append(line)
    # A Connection header naming Content-Length does not take the framing away (the client would have none).
    named.discard(b"content-length")
    lines = [ln for ln in lines if ln.partition(b":")[0].lower() not in named]
    length = 0
    if method == "HEAD" or status < 200 or status in (204, 304):
        framing = NONE
    elif encodings:
        # RFC 9112 6.3: with Transfer-Encoding, Content-Length is ignored (and must not be relayed)
        if encodings.count(b"chunked") > 1:  # RFC 9112 7: applied once; a client may read two layers
            raise ValueError("chunked applied more than once")
        framing = CHUNKED if encodings[-1] == b"chunked" else CLOSE
        lines = [ln for ln in lines if ln.partition(b":")[0].lower() != b"content-length"]
    elif lengths:
        if len(lengths) > 1 or not next(iter(lengths)).isdigit():
            raise ValueError("a bad or conflicting Content-Length")
        length = int(next(iter(lengths)))
        framing = LENGTH if length else NONE
    else:
        framing = CLOSE
    # The Transfer-Encoding lines go to a client that gets the same framing: chunked, or a coding that runs to
    # the close (without its label the client would take gzip bytes for the body).
    return Head(status, reason, lines, content_type, framing, length, close or framing == CLOSE,
                te_lines if framing in (CHUNKED, CLOSE) else [])


_HEX = b"0123456789abcdefABCDEF"


def chunk_size(token: bytes) -> int:
    """A chunk-size as RFC 9112 7.1 spells it (hex digits only); ValueError otherwise. Python's int(..., 16)
    alone also reads '-0', '+0', '0x0', ' 0' and '0_0', which an HTTP client behind the proxy does not:
    the two would disagree on where the body ends."""
    if not token or token.translate(None, _HEX):
        raise ValueError("a chunk size that is not hex digits")
    return int(token, 16)


class ChunkedReader:
    """The chunked framing taken off, incrementally: feed() returns the chunk bodies in a read; `done` once the
    last chunk (and its trailers) has passed, and `end`, where in the read it did. ValueError on a framing an
    HTTP client would not read the same way (RFC 9112 7.1: hex sizes, every line and chunk ended by CRLF)."""

    __slots__ = ("_left", "_crlf", "_line", "_trailer", "done", "end")

    def __init__(self) -> None:
        self._left = 0  # body bytes left in the current chunk
        self._crlf = b""  # what is still due of the CRLF after a chunk's body
        self._line = b""  # an unfinished size (or trailer) line
        self._trailer = False
        self.done = False
        self.end = 0  # once done: the offset in the last read just past the message (bytes after it are extra)

    def feed(self, data: bytes) -> bytes:
        out: list[bytes] = []
        i, n = 0, len(data)
        if not (self._left or self._crlf or self._line or self._trailer):
            end = data.find(b"\r\n", 0, 18)
            if 0 < end:  # the most usual read of all: one whole chunk
                token = data[:end]
                if not token.translate(None, _HEX):
                    stop = end + 2 + int(token, 16)
                    if stop + 2 == n and stop > end + 2 and data[stop:] == b"\r\n":
                        return data[end + 2:stop]
            # The usual read: whole chunks, each "SIZE\r\nBODY\r\n"; anything else goes the long way below.
            while i < n:
                end = data.find(b"\r\n", i)
                if end < 0 or end - i > 16:
                    break
                token = data[i:end]
                if not token or token.translate(None, _HEX):
                    break  # an extension (or garbage): the long way
                size = int(token, 16)
                stop = end + 2 + size
                if size <= 0 or stop + 2 > n or data[stop:stop + 2] != b"\r\n":
                    break
                out.append(data[end + 2:stop])
                i = stop + 2
            if i == n:
                return out[0] if len(out) == 1 else b"".join(out)
        while i < n and not self.done:
            if self._left:
                take = min(self._left, n - i)
                out.append(data[i:i + take] if take != n else data)
                i += take
                self._left -= take
                if not self._left:
                    self._crlf = b"\r\n"
                continue
            if self._crlf:
                take = min(len(self._crlf), n - i)
                if data[i:i + take] != self._crlf[:take]:
                    raise ValueError("a chunk not ended by CRLF")
                i += take
                self._crlf = self._crlf[take:]
                continue
            end = data.find(b"\n", i)
            if end < 0:
                self._line += data[i:]
                if len(self._line) > MAX_CHUNK_LINE:
                    raise ValueError("a chunk line too long")
                break
            line = self._line + data[i:end] if self._line else data[i:end]
            self._line = b""
            i = end + 1
            if not line.endswith(b"\r") or len(line) > MAX_CHUNK_LINE:
                raise ValueError("a chunk line not ended by CRLF")
            line = line[:-1]
            if self._trailer:
                if not line:
                    self.done = True
                continue
            size = chunk_size(line.partition(b";")[0].rstrip(b" \t"))  # (whitespace before an extension: BWS)
            if size:
                self._left = size
            else:
                self._trailer = True
        if self.done:
            self.end = i
        return out[0] if len(out) == 1 else b"".join(out)


OnPayload = Callable[[float, bytes], None]


class Accounting:
    """The reads of one loop turn, accounted after the turn's writes: every stream's bytes go out before any
    stream's are parsed (a parse never delays another stream's chunk). Each read keeps the time it came;
    the handler's wake-up at the end of a response is queued after its reads, so they are in before it."""

    def __init__(self) -> None:
        self._reads: list[tuple[OnPayload, float, bytes]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, on_payload: OnPayload, t: float, data: bytes) -> None:
        reads = self._reads
        if not reads:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self._run)
        reads.append((on_payload, t, data))

    def flush(self) -> None:
        """Account what is queued now (a response that ended is recorded after all its reads)."""
        self._run()

    def _run(self) -> None:
        if not self._reads:
            return
        reads, self._reads = self._reads, []
        for on_payload, t, data in reads:
            on_payload(t, data)  # guarded by its maker (server.py): it never raises


class UpstreamConnection(asyncio.Protocol):
    """One connection to the upstream, one request at a time: reads a response head, then relays the body."""

    def __init__(self, pool: "UpstreamPool") -> None:
        self._pool = pool
        self._accounting = pool.accounting
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.used = False  # has carried a request before (a reused connection may have been closed under us)
        self.expiry: asyncio.TimerHandle | None = None  # when idle in the pool: its closing
        self._method = "GET"
        self._buf = bytearray()  # the head, until it is whole
        self._rest = b""  # body bytes read with the head
        self._mode = "idle"  # idle, head, wait (head read, body not yet relayed), body, done
        self._event: asyncio.Future[str] | None = None
        self._head: asyncio.Future[Head] | None = None
        self._client: asyncio.Transport | None = None
        self._on_payload: OnPayload | None = None
        self._now: Callable[[], float] = time.monotonic
        self._framing, self._left, self._pass = NONE, 0, True
        self._chunks: ChunkedReader | None = None
        self._got_bytes = False
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._high = HIGH_WATER
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- asyncio's side -----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        if self._mode == "body":
            self._relay(data)
        elif self._mode == "head":
            self._read_head(data)
        elif self._mode == "wait":
            self._rest += data
        else:  # nothing was asked (or more than the answer): the connection is not one to reuse
            self._mode = "broken"
            self.close()

    def eof_received(self) -> bool:
        return False  # close; connection_lost says the rest

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._pool.forget(self)
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ConnectionResetError("the upstream closed the connection"))
        if self._mode == "head":
            self._fail(UpstreamBroke("disconnected", "the upstream closed the connection before answering"))
        elif self._mode == "body":  # ("wait": relay_to decides, once the bytes read with the head are relayed)
            self._ended()

    def _ended(self) -> None:
        """The connection closed mid-body: the end of a body that runs to the close, else a broken one."""
        if self._framing == CLOSE:
            self._mode = "done"
            self._wake(DONE)
        else:
            self._fail(UpstreamBroke("disconnected", "the upstream closed the connection mid-response"))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # -- the handler's side ---------------------------------------------------------------------------

    def send(self, method: str, data: bytes) -> "asyncio.Future[Head]":
        """Write the request (or its head); the future is the response head."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self._method, self._mode, self._got_bytes = method, "head", False
        self._head, self._event = loop.create_future(), None
        self._rest, self._buf, self._error = b"", bytearray(), None
        self.used = True
        self.transport.write(data)
        return self._head

    def write(self, data: bytes) -> None:
        if self.transport is None:
            raise ConnectionResetError("the upstream closed the connection")
        self.transport.write(data)

    async def drain(self) -> None:
        if self._write_paused and self.transport is not None:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    def relay_to(self, client: asyncio.Transport, on_payload: OnPayload | None, now: Callable[[], float],
                 pass_framing: bool) -> None:
        """Start relaying the body to `client`: what was read with the head first, then each read."""
        self._client, self._on_payload, self._now, self._pass = client, on_payload, now, pass_framing
        self._high = client.get_write_buffer_limits()[1]
        if self._framing == NONE:
            self._mode = "done"
            self._wake(DONE)
            return
        self._mode = "body"
        rest, self._rest = self._rest, b""
        if rest:
            self._relay(rest)
        if self._mode != "body":
            return
        if self.transport is None:  # closed while the head was handled
            self._ended()
        elif not self._paused_for_client():
            self.transport.resume_reading()

    async def wait(self) -> str:
        """PAUSED (the client's buffers are full: wait for them, then resume()) or DONE; raises UpstreamBroke
        or ClientGone."""
        if self._error is not None:
            self._pool.accounting.flush()
            raise self._error
        if self._event is None:
            self._event = self._loop.create_future()  # type: ignore[union-attr]
        event = self._event
        try:
            result = await event
        except BaseException:
            self._pool.accounting.flush()
            raise
        finally:
            if self._event is event:
                self._event = None
        if result == DONE:
            self._pool.accounting.flush()
        return result

    def resume(self) -> None:
        if self.transport is not None and self._mode == "body":
            self.transport.resume_reading()

    @property
    def answered(self) -> bool:
        """Whether the upstream sent any byte since the request went out: then it has the request."""
        return self._got_bytes

    @property
    def reusable(self) -> bool:
        return self._mode == "done" and self.transport is not None and not self._head_close and not self._rest

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- inside -----------------------------------------------------------------------------------

    _head_close = False

    def _read_head(self, data: bytes) -> None:
        self._buf += data
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD:
                    self._fail(UpstreamBroke("unrelayable", "the upstream's headers are too large"))
                return
            if end > MAX_HEAD:  # (a head that came in one read is held to the limit too)
                self._fail(UpstreamBroke("unrelayable", "the upstream's headers are too large"))
                return
            block, rest = bytes(self._buf[:end]), bytes(self._buf[end + 4:])
            self._buf.clear()
            try:
                head = parse_head(block, self._method)
            except ValueError as exc:
                self._fail(UpstreamBroke("unrelayable", str(exc)))
                return
            if 100 <= head.status < 200:  # an interim answer (100 Continue): not relayed, the final one follows
                self._buf += rest
                continue
            self._framing, self._left, self._head_close = head.framing, head.length, head.close
            self._chunks = ChunkedReader() if head.framing == CHUNKED else None
            self._mode, self._rest = "wait", rest
            if self.transport is not None:
                self.transport.pause_reading()  # until the client has the head
            if self._head is not None and not self._head.done():
                self._head.set_result(head)
            return

    def _relay(self, data: bytes) -> None:
        """One read of the body: to the client first, then to the accounting."""
        now = self._now()
        framing, client = self._framing, self._client
        assert client is not None
        if client.is_closing():  # the client went away: nothing more can be written
            if self.transport is not None:
                self.transport.pause_reading()
            self._fail(ClientGone("the client closed its connection"))
            return
        done = False
        if framing == LENGTH:
            if len(data) >= self._left:
                if len(data) > self._left:
                    data = data[:self._left]
                    self._extra()
                done = True
            self._left -= len(data)
            payload = data
        elif framing == CHUNKED:
            # The framing is read before the bytes go (a few comparisons a chunk): what follows the last chunk
            # or a broken framing never reaches the client, who would read it as the answer to its next request.
            chunks = self._chunks
            try:
                payload = chunks.feed(data)  # type: ignore[union-attr]
            except ValueError:
                self._fail(UpstreamBroke("disconnected", "the upstream's chunked framing is broken"))
                return
            done = chunks.done  # type: ignore[union-attr]
            if done and chunks.end < len(data):  # type: ignore[union-attr]
                data = data[:chunks.end]  # type: ignore[union-attr]
                self._extra()
            if self._pass or payload:
                client.write(data if self._pass else payload)
            data = b""
        else:
            payload = data
        if data:
            client.write(data)
        on_payload = self._on_payload
        if payload and on_payload is not None:
            self._accounting.add(on_payload, now, payload)
        if done:
            self._mode = "done"
            self._wake(DONE)
        elif client.get_write_buffer_size() > self._high:  # (_paused_for_client, inline: once a read)
            if self.transport is not None:
                self.transport.pause_reading()
            self._wake(PAUSED)

    def _extra(self) -> None:
        """The upstream sent more than the response: it is out of step with the proxy (a second answer nobody
        asked for), so the bytes are dropped and the connection is not reused."""
        self._head_close = True

    def _paused_for_client(self) -> bool:
        return self._client is not None and self._client.get_write_buffer_size() > self._high

    def _signal(self) -> "asyncio.Future[str]":
        if self._event is None or self._event.done():
            self._event = self._loop.create_future()
        return self._event

    def _wake(self, event: str) -> None:
        self._signal().set_result(event)

    def _fail(self, exc: BaseException) -> None:
        self._mode = "broken"
        self._head_close = True
        if self._head is not None and not self._head.done():
            self._head.set_exception(exc)
        elif self._event is not None and not self._event.done():  # the handler waits on it
            self._event.set_exception(exc)
        else:
            self._error = exc  # for the handler's next wait()
        self.close()


class UpstreamPool:
    """Connections to the upstream, kept alive between requests for `keepalive` s (under uvicorn's 5 s, so the
    proxy drops an idle one before the upstream does)."""

    def __init__(self, upstream: str, connect_timeout: float | None, limit: int, keepalive: float = 4.0) -> None:
        parts = urlsplit(upstream)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if parts.scheme == "https" else None
        self.host_header = parts.netloc.rpartition("@")[2].encode("ascii", "replace")
        self.base_path = parts.path.rstrip("/").encode("ascii", "replace")
        self.connect_timeout, self.keepalive = connect_timeout, keepalive
        self._idle: list[UpstreamConnection] = []
        self._all: set[UpstreamConnection] = set()
        self.accounting = Accounting()
        self.limit = limit  # upstream sockets open at once (one per client connection at most)
        self._slots = asyncio.Semaphore(limit)
        # A host name is resolved once per DNS_TTL s (as aiohttp's connector cached it), not per connection: a
        # burst of new connections must not queue lookups (in a pod, each may try several search domains).
        self._literal = _is_address(self.host)
        self._addresses: list[tuple[str, int]] = []
        self._resolved_until = 0.0

    async def get(self) -> UpstreamConnection:
        """An idle connection kept alive, else a new one (asyncio.TimeoutError, OSError on failure)."""
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.expiry is not None:
                conn.expiry.cancel()
                conn.expiry = None
            if conn.transport is not None and not conn.transport.is_closing() and now - conn.idle_since < self.keepalive:
                return conn
            conn.close()
        await self._slots.acquire()
        try:
            conn = await asyncio.wait_for(self._connect(), self.connect_timeout)
        except BaseException:
            self._slots.release()
            raise
        self._all.add(conn)
        return conn

    async def _connect(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        server_hostname = self.host if self.ssl is not None else None
        error: OSError | None = None
        for host, port in await self._resolve():
            try:
                _, conn = await loop.create_connection(lambda: UpstreamConnection(self), host, port, ssl=self.ssl,
                                                       server_hostname=server_hostname)
                return conn
            except OSError as exc:
                error = exc
        self._resolved_until = 0.0  # none answered: look the name up again next time
        raise error or OSError(f"{self.host} has no address")

    async def _resolve(self) -> list[tuple[str, int]]:
        if self._literal:
            return [(self.host, self.port)]
        now = time.monotonic()
        if not self._addresses or now >= self._resolved_until:
            infos = await asyncio.get_running_loop().getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            self._addresses = list(dict.fromkeys((str(info[4][0]), int(info[4][1])) for info in infos))
            self._resolved_until = now + DNS_TTL
        return self._addresses

    def put(self, conn: UpstreamConnection) -> None:
        """Back to the pool when its response was read to the end and it may be reused; else closed."""
        if conn.reusable:
            conn._mode = "idle"
            conn.idle_since = time.monotonic()
            conn._client = conn._on_payload = None
            if conn.transport is not None:
                conn.transport.resume_reading()  # to see it close while idle
            conn.expiry = asyncio.get_running_loop().call_later(self.keepalive, self._expire, conn)
            self._idle.append(conn)
        else:
            conn.close()

    def _expire(self, conn: UpstreamConnection) -> None:
        """Close a connection idle for `keepalive` s (before the upstream does)."""
        conn.expiry = None
        if conn in self._idle:
            self._idle.remove(conn)
            conn.close()

    def forget(self, conn: UpstreamConnection) -> None:
        if conn.expiry is not None:
            conn.expiry.cancel()
            conn.expiry = None
        if conn in self._all:
            self._all.remove(conn)
            self._slots.release()
        if conn in self._idle:
            self._idle.remove(conn)

    def close(self) -> None:
        for conn in self._idle:
            if conn.expiry is not None:
                conn.expiry.cancel()
        for conn in list(self._all):
            conn.close()
        self._idle.clear()


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
