"""Fetching an engine endpoint: bounded in time and in size, every failure named.

The body is read in chunks up to a cap, so a 50 MB answer costs at most the cap in memory, and its
decoded text may take no more than the cap either (one character beyond Latin-1 makes Python hold
every character of a page in 2 or 4 bytes: 4 MiB of bytes with one emoji would be 16 MiB of text); the
sample's timestamp is the midpoint between sending the request and the headers arriving, which is
when the engine rendered its counters, not when the last byte crawled in.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import zlib
from dataclasses import dataclass
from typing import Callable, NamedTuple
from urllib.parse import SplitResult, quote, unquote, urlsplit

import aiohttp

from rooflight.collectors.common import DEFAULT_MAX_BODY_BYTES
from rooflight.collectors.errors import SourceError

_CHUNK = 64 * 1024
_EMPTY_SIZE = sys.getsizeof("")
_TEXT_HEADER_SLACK = 64  # a non-ASCII str has a larger header than an empty one: not the page's fault
_BEYOND_BMP = re.compile(rb"[\xf0-\xf4]")  # lead bytes of 4-byte UTF-8: characters Python holds in 4 bytes



@dataclass(frozen=True, slots=True)
class Fetched:
    text: str
    timestamp: float  # monotonic midpoint of request and response headers
    duration: float  # whole request, seconds


async def fetch_text(
    session: aiohttp.ClientSession,
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    monotonic: Callable[[], float],
) -> Fetched:
    start = monotonic()
    shown = _public(url)
    try:
        async with asyncio.timeout(timeout):
            async with session.get(url, allow_redirects=False) as response:
                answered = monotonic()
                if response.status != 200:
                    raise SourceError("http_status", f"{shown} answered HTTP {response.status}")
                body = await _read_capped(response, max_bytes, shown)
    except SourceError:
        raise
    except TimeoutError:
        raise SourceError("timeout", f"{shown} did not answer within {timeout:g}s") from None
    except aiohttp.ClientConnectorError as exc:
        raise SourceError("refused", f"{shown}: cannot connect ({exc.os_error or exc})") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise SourceError("other", f"{shown}: {type(exc).__name__}: {_scrub(str(exc), url)}") from None
    return Fetched(text=_text(body, max_bytes, shown), timestamp=(start + answered) / 2, duration=monotonic() - start)


def _text(body: bytes | bytearray, max_bytes: int, shown: str) -> str:
    """The body as text, refused (too_large) when the text would take more than `max_bytes` of memory.

    A character beyond the BMP is decided on the bytes, before a text four times their size exists."""
    limit = max_bytes + _TEXT_HEADER_SLACK
    if 4 * len(body) > limit and not body.isascii() and _BEYOND_BMP.search(body):
        raise SourceError("too_large", f"{shown}: body of {len(body)} bytes holds characters beyond the BMP "
                                       f"(4 bytes each as text): over the {max_bytes}-byte cap")
    text = body.decode("utf-8", errors="replace")
    held = sys.getsizeof(text) - _EMPTY_SIZE
    if held > limit:
        raise SourceError("too_large", f"{shown}: body of {len(body)} bytes takes {held} bytes as text (characters "
                                       f"beyond Latin-1 take 2 or 4 bytes each), over the {max_bytes}-byte cap")
    return text


async def fetch_json(
    session: aiohttp.ClientSession, url: str, *, timeout: float, max_bytes: int = 1024 * 1024
) -> object:
    """A small JSON document (an engine's /v1/models, /server_info, /info, /props)."""
    loop = asyncio.get_running_loop()
    fetched = await fetch_text(session, url, timeout=timeout, max_bytes=max_bytes, monotonic=loop.time)
    try:
        return json.loads(fetched.text)
    except ValueError:
        raise SourceError("parse", f"{_public(url)}: not JSON") from None


def _public(url: str) -> str:
    """The URL as messages show it: without user:password, query (`?token=...`) or fragment."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url.partition("#")[0].partition("?")[0]
    netloc, slash, path = rest.partition("#")[0].partition("?")[0].partition("/")
    return f"{scheme}{sep}{netloc.rpartition('@')[2]}{slash}{path}"


def _scrub(text: str, url: str) -> str:
    """A library's error text with the URL's user:password, query and fragment, if any, masked, however the
    text escapes them (the library, or an engine echoing the request, may show `%7B` for `{`, `%2F` for `%2f`)."""
    before_fragment, _, fragment = url.partition("#")
    query = before_fragment.partition("?")[2]
    userinfo = url.partition("://")[2].partition("/")[0].partition("?")[0].partition("#")[0].rpartition("@")[0]
    for secret in sorted((s for s in (userinfo, query, fragment) if s), key=len, reverse=True):
        text = text.replace(secret, "***")
        text = re.sub(_any_escaping(unquote(secret)), "***", text)
    return text


def _any_escaping(secret: str) -> str:
    """A pattern matching `secret` with any of its characters written as it is or percent-escaped."""
    def one(char: str) -> str:
        escaped = "".join(f"%{b:02x}" for b in char.encode("utf-8", errors="replace"))
        plus = r"|\+" if char == " " else ""  # a space in a query may be written +
        return f"(?:{re.escape(char)}|(?i:{re.escape(escaped)}){plus})"
    return "".join(one(c) for c in secret)


async def _read_capped(response: aiohttp.ClientResponse, max_bytes: int, url: str) -> bytes:
    length = response.content_length
    if length is not None and length > max_bytes:
        raise SourceError("too_large", f"{url}: body of {length} bytes is over the {max_bytes}-byte cap")
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(_CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise SourceError("too_large", f"{url}: body passed the {max_bytes}-byte cap; not read further")
        chunks.append(chunk)
    return b"".join(chunks)


class PageClient:
    """An engine loop's reads of its pages over one kept-alive HTTP/1.1 connection of its own, at the level
    of the stream: a request is one write, a response its status line, headers and body read off the
    socket, with fetch_text's bounds, timestamp and errors. An engine loop never overlaps its own reads,
    so one connection is all it needs.

    Why not the aiohttp session: its request and response machinery was 8% of the agent's CPU at 1 target x
    10 Hz and 11% at 64 targets x 1 Hz (bench/bench_process_cpu.py --profile); README's whole-process table
    gives the agent's CPU before and after. An https URL, or one with a user:password (basic auth), still
    goes through the session (fetch_text).

    No Accept-Encoding is sent, so a page comes as it is (gzip or deflate, if sent anyway, is inflated).
    A connection that failed, timed out or was cancelled mid-read is closed; the next read opens another. One
    the engine closed, reset, or sent bytes on unasked is not reused (those bytes are never read as a page),
    and a request that met a kept connection's close or reset before a byte came back is sent again anew.
    """

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in session.headers.items()
                                if k.lower() not in ("host", "accept-encoding", "connection", "content-length"))
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._peer: tuple[str, int] | None = None
        self._requests: dict[str, _Request] = {}  # by URL: a loop reads the same one or two on every sample
        self.connections = 0  # opened so far (tests: keep-alive holds)

    async def fetch_text(self, url: str, *, timeout: float, max_bytes: int,
                         monotonic: Callable[[], float]) -> Fetched:
        """What fetch_text(session, url, ...) gives, over this client's connection where the URL allows."""
        request = self._requests.get(url)
        parts = urlsplit(url) if request is None else None
        if parts is not None and (parts.scheme != "http" or "@" in parts.netloc or parts.hostname is None):
            return await fetch_text(self.session, url, timeout=timeout, max_bytes=max_bytes, monotonic=monotonic)
        start = monotonic()
        shown = _public(url) if request is None else request.shown
        try:
            async with asyncio.timeout(timeout):
                if request is None:
                    request = self._request(url, parts, shown)  # type: ignore[arg-type]
                answered, body = await self._get(request, max_bytes, monotonic)
        except SourceError:
            self.close()
            raise
        except TimeoutError:
            self.close()
            raise SourceError("timeout", f"{shown} did not answer within {timeout:g}s") from None
        except _Refused as exc:
            self.close()
            raise SourceError("refused", f"{shown}: cannot connect ({exc.args[0]})") from None
        except _Malformed as exc:
            self.close()
            raise SourceError("other", f"{shown}: ValueError: {exc.shown(url)}") from None
        except (OSError, ValueError, EOFError, zlib.error, asyncio.LimitOverrunError) as exc:
            self.close()
            raise SourceError("other", f"{shown}: {type(exc).__name__}: {_scrub(str(exc), url)}") from None
        except BaseException:  # cancelled mid-read: the connection's state is unknown
            self.close()
            raise
        return Fetched(text=_text(body, max_bytes, shown), timestamp=(start + answered) / 2,
                       duration=monotonic() - start)

    def close(self) -> None:
        if self._conn is not None:
            self._conn[1].close()
            self._conn = None

    def _request(self, url: str, parts: SplitResult, shown: str) -> _Request:
        """The URL's peer and request bytes, kept for its next reads (ValueError for a port that is no number)."""
        peer = (parts.hostname or "", 80 if parts.port is None else parts.port)
        path, query = (_LONE_PERCENT.sub("%25", p) for p in (parts.path or "/", parts.query))
        target = quote(path, safe=_URL_SAFE) + (f"?{quote(query, safe=_URL_SAFE + '?')}" if query else "")
        request = _Request(peer, f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n{self._headers}\r\n"
                           .encode("latin-1"), shown)
        if len(self._requests) >= _REQUESTS_KEPT:
            self._requests.clear()
        self._requests[url] = request
        return request

    async def _get(self, prepared: _Request, max_bytes: int,
                   monotonic: Callable[[], float]) -> tuple[float, bytes | bytearray]:
        peer, request, shown = prepared
        reused = self._conn is not None and self._peer == peer and self._clean()
        if not reused:
            self.close()
            await self._connect(peer)
        assert self._conn is not None
        reader, writer = self._conn
        writer.write(request)
        try:
            head = await _read_head(reader)
        except NoAnswerError:  # closed or reset before a byte of the answer
            if not reused:
                raise
            self.close()  # the engine closed (or reset) the idle connection as the request went out: once more, anew
            await self._connect(peer)
            reader, writer = self._conn  # type: ignore[misc]
            writer.write(request)
            head = await _read_head(reader)
        status, headers, version = _response_head(head)
        while 100 <= status < 200 and status != 101:  # informational (103 Early Hints): skipped, as the session does
            status, headers, version = _response_head(await _read_head(reader))
        answered = monotonic()
        if status != 200:
            raise SourceError("http_status", f"{shown} answered HTTP {status}")
        body = await _read_body(reader, headers, max_bytes, shown)
        body = _inflated(body, headers.get("content-encoding", "identity"), max_bytes, shown)
        if headers.get("connection", "").lower() == "close" or (version == "HTTP/1.0" and
                                                                 headers.get("connection", "").lower() != "keep-alive"):
            self.close()
        return answered, body

    def _clean(self) -> bool:
        """Whether the kept connection can carry the next request: not reset, not closed by the engine, and
        holding no bytes the engine sent unasked (a lying Content-Length's leftover, read as the next answer,
        would be a wrong page; the session closes such a connection too). StreamReader has no public way to
        ask for what it holds."""
        assert self._conn is not None
        reader, writer = self._conn
        return not (writer.is_closing() or reader.at_eof() or reader.exception() is not None
                    or reader._buffer)

    async def _connect(self, peer: tuple[str, int]) -> None:
        try:
            self._conn = await asyncio.open_connection(*peer)
        except OSError as exc:
            raise _Refused(str(exc)) from None
        self._peer = peer
        self.connections += 1


class _Request(NamedTuple):
    """One URL's read as PageClient sends it: where to, the request's bytes, and the URL as messages show it."""

    peer: tuple[str, int]
    data: bytes
    shown: str


_REQUESTS_KEPT = 16  # URLs a PageClient keeps the requests of (a loop reads its page and the info endpoint)
_URL_SAFE = "/%:@!$&'()*+,;=-._~"  # what stays as written in a request's path and query (escapes kept)
_LONE_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")  # a % that starts no escape is sent as %25, as the session does


async def _read_head(reader: asyncio.StreamReader) -> list[bytes]:
    """A response's head, its lines without their ends (CRLF or LF alone, as the session's parser reads them),
    at most 64 KiB. NoAnswerError when the connection closed or was reset before any byte of it."""
    lines: list[bytes] = []
    size = 0
    started = False  # a byte of the answer came: a close or a reset from here on is no idle one
    while True:
        try:
            if not started:  # an answer not in HTTP/1 (HTTP/2 frames) is refused at once, not waited on for a line end
                if (start := await reader.readexactly(5)) != b"HTTP/":
                    raise _Malformed("not an HTTP/1 answer:", start)
                started = True
                line = start + await reader.readuntil(b"\n")
            else:
                line = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            if started or exc.partial:
                raise EOFError("the connection closed in the response's headers") from None
            raise NoAnswerError("the connection closed before the response's headers") from None
        except ConnectionResetError:
            if started:
                raise
            raise NoAnswerError("the connection was reset before the response's headers") from None
        except asyncio.LimitOverrunError:
            raise _Malformed("response headers over 64 KiB") from None
        size += len(line)
        if size > _HEAD_LIMIT:
            raise _Malformed("response headers over 64 KiB")
        if len(line) > _LINE_LIMIT:
            raise _Malformed("a response header line over 8 KiB:", line)
        line = line.removesuffix(b"\n").removesuffix(b"\r")
        if not line:
            return lines
        lines.append(line)


_HEAD_LIMIT = 64 * 1024
_LINE_LIMIT = 8190 + 2  # a head line and its CRLF, as the session's parser bounds them


class NoAnswerError(EOFError):
    """The connection closed or was reset before any byte of the answer: on a kept connection, sent again anew."""


class _Malformed(ValueError):
    """An answer the engine framed wrong, with the text that shows how. The text is cut short only after the
    URL's secrets in it are masked: an engine echoing the request line would otherwise show the start of a
    query token, which a mask of the whole token no longer finds once the text is cut."""

    def __init__(self, what: str, text: str | bytes = "") -> None:
        super().__init__(what)
        self.what = what
        self.text = text.decode("latin-1") if isinstance(text, bytes) else text

    def shown(self, url: str) -> str:
        """The message, secrets masked, then the engine's text cut to 80 characters."""
        return f"{self.what} {_scrub(self.text, url)[:80]!r}" if self.text else self.what


class _Refused(Exception):
    """The connection could not be opened (the session's ClientConnectorError)."""


def _response_head(head: list[bytes]) -> tuple[int, dict[str, str], str]:
    """Status, headers (names lowercase) and version of a response head's lines; ValueError when malformed, or
    when its framing could be read two ways (Content-Length twice, or with Transfer-Encoding), as the session's
    parser refuses it: two readers of one stream must never see two different pages."""
    lines = [line.decode("latin-1") for line in head]
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1.") or not _STATUS.match(rest) or _CONTROL.search(lines[0]):
        raise _Malformed("bad status line", lines[0])
    headers: dict[str, str] = {}
    name = ""
    for line in lines[1:]:  # none is empty: the head ends at its first empty line (_read_head)
        if line[0] in " \t" and name:  # obs-fold: the previous header's value continues
            if _CONTROL.search(line):
                raise _Malformed("bad header line", line)
            headers[name] = f"{headers[name]} {line.strip()}"
            continue
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name) or _CONTROL.search(value):
            raise _Malformed("bad header line", line)
        name = name.lower()
        if name == "content-length" and name in headers:
            raise _Malformed("duplicate Content-Length")
        headers[name] = f"{headers[name]}, {value.strip()}" if name in headers else value.strip()
    if "content-length" in headers and "transfer-encoding" in headers:
        raise _Malformed("both Transfer-Encoding and Content-Length")
    return int(rest[:3]), headers, version


_STATUS = re.compile(r"[0-9]{3}(?: |$)")
# A header's name is a token; no line holds a control character but HTAB. A bare CR inside a line is one:
# a reader that ends lines there would see another header, and two readers must never see two pages.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str], max_bytes: int,
                     shown: str) -> bytes | bytearray:
    """The body as framed by Transfer-Encoding: chunked, Content-Length, or the connection's end; capped, in
    one buffer (for a Content-Length, the reader's own bytes up to its limit, else one filled in place; else
    grown, a reader's limit at a time: _read_into)."""
    if headers.get("transfer-encoding", "").lower().rpartition(",")[2].strip() == "chunked":
        return await _read_chunked(reader, max_bytes, shown)
    length = headers.get("content-length")
    if length is not None:
        if not length.isdecimal():
            raise _Malformed("bad Content-Length", length)
        size = int(length)
        if size > max_bytes:
            raise SourceError("too_large", f"{shown}: body of {length} bytes is over the {max_bytes}-byte cap")
        if size <= _PIECE:  # one piece, the reader's own copy (a vLLM page: ~55 kB): no second one
            return await reader.readexactly(size)
        # One block of the page's size, filled in place: grown piece by piece, the buffer was reallocated and
        # copied on the way, and the agent's peak RSS on 4 MiB pages reached 95.8-96.9 MB in 2 of 10 runs of
        # tests/collectors/test_bounds.py's RSS test (peak printed); filled in place, 86.6-88.3 in 5 runs.
        body = bytearray(size)
        with memoryview(body) as view:
            at = 0
            while at < len(body):
                piece = await reader.readexactly(min(len(body) - at, _PIECE))
                view[at:at + len(piece)] = piece
                at += len(piece)
        return body
    body = bytearray()  # no length: the body ends with the connection (one buffer, however small the reads)
    while read := await reader.read(max_bytes + 1 - len(body)):
        body += read
        if len(body) > max_bytes:
            raise SourceError("too_large", f"{shown}: body passed the {max_bytes}-byte cap; not read further")
    return body


async def _read_into(body: bytearray, reader: asyncio.StreamReader, n: int) -> None:
    """Append the next `n` bytes to `body`, a reader's limit at a time (readexactly of all `n` at once holds the
    reader's buffer of them and its copy together: with the body, 3x a page sent in one chunk)."""
    while n:
        piece = await reader.readexactly(min(n, _PIECE))
        body += piece
        n -= len(piece)


_PIECE = 64 * 1024  # asyncio.open_connection's reader limit: what it buffers before it stops reading


async def _read_chunked(reader: asyncio.StreamReader, max_bytes: int, shown: str) -> bytearray:
    body = bytearray()  # not a bytes object per chunk: a page in 1-byte chunks would cost 40x its size
    while True:
        line = await reader.readuntil(b"\r\n")
        size_field = line.split(b";", 1)[0].strip()
        if not _CHUNK_SIZE.fullmatch(size_field):
            raise _Malformed("bad chunk size", size_field)
        n = int(size_field, 16)
        if n == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
            return body
        if len(body) + n > max_bytes:
            raise SourceError("too_large", f"{shown}: body passed the {max_bytes}-byte cap; not read further")
        await _read_into(body, reader, n)
        if await reader.readexactly(2) != b"\r\n":
            raise ValueError("bad chunk framing")


def _inflated(body: bytes | bytearray, encoding: str, max_bytes: int, shown: str) -> bytes | bytearray:
    """A body sent compressed anyway (no Accept-Encoding was sent), inflated up to the cap: every member of a
    gzip body (RFC 1952 allows several); one cut short, or followed by bytes that are no member, is refused as
    the session refuses it, never read as a whole page."""
    encoding = encoding.lower()
    if encoding in ("identity", ""):
        return body
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise _Malformed("unsupported Content-Encoding", encoding)
    gzip = encoding != "deflate"
    wbits = 47 if gzip or body[:1] == b"\x78" else -15  # 47: gzip or zlib header; -15: raw deflate
    out, rest = bytearray(), bytes(body)
    for _ in range(_GZIP_MEMBERS_MAX):
        inflate = zlib.decompressobj(wbits)
        out += inflate.decompress(rest, max_bytes + 1 - len(out))
        if len(out) > max_bytes:
            raise SourceError("too_large", f"{shown}: body passed the {max_bytes}-byte cap; not read further")
        if not inflate.eof:
            raise _Malformed("compressed body cut short")
        rest = inflate.unused_data
        if not rest:
            return out
        if not (gzip and rest[:2] == b"\x1f\x8b"):
            raise _Malformed("bytes after the compressed body")
    raise _Malformed(f"a gzip body of over {_GZIP_MEMBERS_MAX} members")


# Each gzip member leaves the rest of the body copied (zlib's unused_data), so a body of empty 20-byte members
# costs the square of its size, on the event loop: 4 MiB of them held /metrics 10-12 s a scrape.
# A server compresses a page as one member; the session reads any number.
_GZIP_MEMBERS_MAX = 16
