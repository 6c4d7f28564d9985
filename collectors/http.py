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
from typing import Callable
from urllib.parse import SplitResult, urlsplit

import aiohttp

from rooflight.collectors.errors import SourceError

_CHUNK = 64 * 1024
_EMPTY_SIZE = sys.getsizeof("")
_TEXT_HEADER_SLACK = 64  # a non-ASCII str has a larger header than an empty one: not the page's fault
_BEYOND_BMP = re.compile(rb"[\xf0-\xf4]")  # lead bytes of 4-byte UTF-8: characters Python holds in 4 bytes

# The default cap on an engine's /metrics body. The largest real page is vLLM's, ~35 KB per
# data-parallel rank plus ~20 KB once (tests/fixtures/engine-samples/vllm-*.prom), ~46 KB per rank
# with a 40-character model name: 64 ranks behind one API server and a thousand LoRA adapter sets
# still fit under 4 MiB. Reading and parsing a page costs about three times its size at the peak
# (bytes, text, samples), so this cap is also what keeps the agent under 100 MB of RSS whatever a
# page holds (docs/reliability.md "Bounds on what an engine can cost").
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


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


def _text(body: bytes, max_bytes: int, shown: str) -> str:
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
    """A library's error text with the URL's user:password, query and fragment, if any, masked."""
    before_fragment, _, fragment = url.partition("#")
    query = before_fragment.partition("?")[2]
    userinfo = url.partition("://")[2].partition("/")[0].partition("?")[0].partition("#")[0].rpartition("@")[0]
    for secret in sorted((s for s in (userinfo, query, fragment) if s), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


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

    Why not the aiohttp session (measured, a loop at 100 Hz reading the 54 kB vLLM page on a loaded 2-core
    machine): 0.69 ms of CPU a read through ClientSession against 0.25 ms here, most of what the agent
    costs at 10 Hz besides the parse (bench/bench_process_cpu.py --profile 1x10). An https URL, or one
    with a user:password (basic auth), still goes through the session (fetch_text).

    No Accept-Encoding is sent, so a page comes as it is (gzip or deflate, if sent anyway, is inflated).
    A connection that failed, timed out or was cancelled mid-read is closed; the next read opens another.
    """

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in session.headers.items()
                                if k.lower() not in ("host", "accept-encoding", "connection", "content-length"))
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._peer: tuple[str, int] | None = None
        self.connections = 0  # opened so far (tests: keep-alive holds)

    async def fetch_text(self, url: str, *, timeout: float, max_bytes: int,
                         monotonic: Callable[[], float]) -> Fetched:
        """What fetch_text(session, url, ...) gives, over this client's connection where the URL allows."""
        parts = urlsplit(url)
        if parts.scheme != "http" or "@" in parts.netloc or parts.hostname is None:
            return await fetch_text(self.session, url, timeout=timeout, max_bytes=max_bytes, monotonic=monotonic)
        start = monotonic()
        shown = _public(url)
        try:
            async with asyncio.timeout(timeout):
                answered, body = await self._get(parts, max_bytes, shown, monotonic)
        except SourceError:
            self.close()
            raise
        except TimeoutError:
            self.close()
            raise SourceError("timeout", f"{shown} did not answer within {timeout:g}s") from None
        except _Refused as exc:
            self.close()
            raise SourceError("refused", f"{shown}: cannot connect ({exc.args[0]})") from None
        except (OSError, ValueError, EOFError, zlib.error) as exc:
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

    async def _get(self, parts: SplitResult, max_bytes: int, shown: str,
                   monotonic: Callable[[], float]) -> tuple[float, bytes]:
        peer = (parts.hostname or "", parts.port or 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        request = f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n{self._headers}\r\n".encode("latin-1")
        reused = self._conn is not None and self._peer == peer and not self._conn[0].at_eof()
        if not reused:
            self.close()
            await self._connect(peer)
        assert self._conn is not None
        reader, writer = self._conn
        writer.write(request)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not (reused and not exc.partial):
                raise EOFError("the connection closed before the response's headers") from None
            self.close()  # the engine closed the idle connection as the request went out: once more, anew
            await self._connect(peer)
            reader, writer = self._conn  # type: ignore[misc]
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise ValueError("response headers over 64 KiB") from None
        answered = monotonic()
        status, headers, version = _response_head(head)
        if status != 200:
            raise SourceError("http_status", f"{shown} answered HTTP {status}")
        body = await _read_body(reader, headers, max_bytes, shown)
        body = _inflated(body, headers.get("content-encoding", "identity"), max_bytes, shown)
        if headers.get("connection", "").lower() == "close" or (version == "HTTP/1.0" and
                                                                 headers.get("connection", "").lower() != "keep-alive"):
            self.close()
        return answered, body

    async def _connect(self, peer: tuple[str, int]) -> None:
        try:
            self._conn = await asyncio.open_connection(*peer)
        except OSError as exc:
            raise _Refused(str(exc)) from None
        self._peer = peer
        self.connections += 1


class _Refused(Exception):
    """The connection could not be opened (the session's ClientConnectorError)."""


def _response_head(head: bytes) -> tuple[int, dict[str, str], str]:
    """Status, headers (names lowercase) and version of a response head; ValueError when malformed."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1.") or len(rest) < 3 or not rest[:3].isdigit():
        raise ValueError(f"bad status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon:
            raise ValueError(f"bad header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return int(rest[:3]), headers, version


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str], max_bytes: int, shown: str) -> bytes:
    """The body as framed by Transfer-Encoding: chunked, Content-Length, or the connection's end; capped."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return await _read_chunked(reader, max_bytes, shown)
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise ValueError(f"bad Content-Length {length[:40]!r}")
        if int(length) > max_bytes:
            raise SourceError("too_large", f"{shown}: body of {length} bytes is over the {max_bytes}-byte cap")
        return await reader.readexactly(int(length))
    body = await reader.read(max_bytes + 1)  # no length: the body ends with the connection
    chunks, size = [body], len(body)
    while body and size <= max_bytes:
        body = await reader.read(max_bytes + 1 - size)
        chunks.append(body)
        size += len(body)
    if size > max_bytes:
        raise SourceError("too_large", f"{shown}: body passed the {max_bytes}-byte cap; not read further")
    return b"".join(chunks)


async def _read_chunked(reader: asyncio.StreamReader, max_bytes: int, shown: str) -> bytes:
    chunks, size = [], 0
    while True:
        line = await reader.readuntil(b"\r\n")
        n = int(line.split(b";", 1)[0].strip(), 16)
        if n == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
            return b"".join(chunks)
        size += n
        if size > max_bytes:
            raise SourceError("too_large", f"{shown}: body passed the {max_bytes}-byte cap; not read further")
        chunks.append(await reader.readexactly(n))
        if await reader.readexactly(2) != b"\r\n":
            raise ValueError("bad chunk framing")


def _inflated(body: bytes, encoding: str, max_bytes: int, shown: str) -> bytes:
    """A body sent compressed anyway (no Accept-Encoding was sent), inflated up to the cap."""
    encoding = encoding.lower()
    if encoding in ("identity", ""):
        return body
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise ValueError(f"unsupported Content-Encoding {encoding[:40]!r}")
    inflate = zlib.decompressobj(47 if encoding != "deflate" or body[:1] == b"\x78" else -15)
    out = inflate.decompress(body, max_bytes + 1)
    if len(out) > max_bytes:
        raise SourceError("too_large", f"{shown}: body passed the {max_bytes}-byte cap; not read further")
    return out
