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
from dataclasses import dataclass
from typing import Callable

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
