"""The one /metrics handler, served by the agent (agent/serve/server.py) and by the proxy (agent/proxy/server.py).

A page is rendered from a registry of snapshot collectors on a thread of its own, never on the event loop,
in the format the client asks for (text or OpenMetrics, prometheus-client's negotiation), restricted to
`name[]` where given, gzipped where Accept-Encoding allows it. With one snapshot feeding the page, each
snapshot's pages are rendered once and shared by every scraper (PageCache). The page goes out a chunk at a
time within a send deadline, so a client that asks and never reads holds one chunk, and is closed.
"""

from __future__ import annotations

import asyncio
import copy
import gzip
import logging
from typing import Any, Awaitable, Callable, Iterator, Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from rooflight.collectors.daemon_executor import DaemonThreadExecutor

log = logging.getLogger("rooflight")

Note = Callable[[str, "str | None"], None]  # (why, client address): a rate-limited log line (proxy.limits.RefusalLog)


def _log_note(why: str, client: str | None) -> None:
    log.warning("closed a /metrics client at %s: %s", client or "?", why)


# /metrics is rendered on one thread of its own, never on the event loop: a big page (many engine series,
# long label values) then delays other scrapes, not sampling or the status page, and renders never pile up.
_RENDER_POOL: list[DaemonThreadExecutor] = []  # made on the first scrape: importing starts no thread


def _render_pool() -> DaemonThreadExecutor:
    if not _RENDER_POOL:
        _RENDER_POOL.append(DaemonThreadExecutor("rooflight-render"))
    return _RENDER_POOL[0]


def render_metrics(registry: CollectorRegistry, accept: str, names: Sequence[str]) -> tuple[bytes, str]:
    """The exposition the client asked for (text or OpenMetrics), restricted to `names` (`name[]`) if any.

    Not prometheus_client's restricted_registry: it picks collectors by describe(), and ours describe
    nothing (their families depend on the snapshot), so it would answer an empty page."""
    encoder, content_type = choose_encoder(accept)
    chosen: Any = _Only(registry, frozenset(names)) if names else registry
    return encoder(chosen), content_type


class _Only:
    """The families of `registry` named in `names`: whole when the family's name is asked for, else only
    the samples asked for by name (`x_count`, `x_total`), as Prometheus' name[] means."""

    def __init__(self, registry: CollectorRegistry, names: frozenset[str]) -> None:
        self._registry, self._names = registry, names

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            if family.name in self._names:
                yield family
                continue
            samples = [s for s in family.samples if s.name in self._names]
            if samples:
                part = copy.copy(family)
                part.samples = samples
                yield part


SEND_CHUNK = 64 * 1024  # bytes of a page handed to the socket at a time: what a client that stops reading holds
SEND_SECONDS = 30.0  # the most a client may take to read one answer of /metrics; then it is closed


class PageCache:
    """The current snapshot's rendered /metrics pages (plain and gzip, text and OpenMetrics), made once per
    snapshot and shared by every scrape of it: N scrapers cost one render and one gzip, and a page sent to
    N clients is one bytes object, not N. Used on the render thread only."""

    def __init__(self) -> None:
        self._snapshot: object = None
        self._pages: dict[tuple[str, bool], tuple[bytes, str]] = {}

    def get(self, snapshot: object, key: tuple[str, bool], make: Callable[[], tuple[bytes, str]]) -> tuple[bytes, str]:
        if snapshot is not self._snapshot:
            self._snapshot, self._pages = snapshot, {}
        if key not in self._pages:
            self._pages[key] = make()
        return self._pages[key]


def _page(registry: CollectorRegistry, accept: str, names: Sequence[str], gzipped: bool) -> tuple[bytes, str]:
    body, content_type = render_metrics(registry, accept, names)
    return (gzip.compress(body, compresslevel=6) if gzipped else body), content_type


def wants_gzip(accept_encoding: str) -> bool:
    """Whether Accept-Encoding allows gzip (Prometheus sends `gzip`); `gzip;q=0` refuses it."""
    for part in accept_encoding.lower().split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip() in ("gzip", "x-gzip"):
            q = params.strip()
            return not (q.startswith("q=") and _quality(q[2:]) == 0.0)
    return False


def _quality(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 1.0


def metrics_handler(registry: CollectorRegistry, same_page_while: Callable[[], object] | None = None, *,
                    refused: Note = _log_note, gone: Note = _log_note
                    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """/metrics: rendered (and gzipped when asked) on the render thread; with `same_page_while` (the current
    snapshot: nothing else feeds the page), once per snapshot for every scraper. The page goes out
    SEND_CHUNK at a time within SEND_SECONDS, so a client that asks and never reads holds one chunk, not the
    page, and is closed at the deadline (noted by `refused`; a client that went away, by `gone`)."""
    cache = PageCache()

    async def handle(request: web.Request) -> web.StreamResponse:
        accept = ",".join(request.headers.getall("Accept", []))
        names = request.query.getall("name[]", [])
        gzipped = wants_gzip(",".join(request.headers.getall("Accept-Encoding", [])))
        if same_page_while is not None and not names:
            snapshot = same_page_while()
            encoder_type = choose_encoder(accept)[1]
            job: Callable[[], tuple[bytes, str]] = lambda: cache.get(  # noqa: E731
                snapshot, (encoder_type, gzipped), lambda: _page(registry, accept, names, gzipped))
        else:
            job = lambda: _page(registry, accept, names, gzipped)  # noqa: E731
        body, content_type = await asyncio.get_running_loop().run_in_executor(_render_pool(), job)
        headers = {"Content-Type": content_type, "Vary": "Accept-Encoding"}
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        return await send_page(request, body, headers, refused=refused, gone=gone)

    return handle


async def send_page(request: web.Request, body: bytes, headers: dict[str, str], *, refused: Note = _log_note,
                    gone: Note = _log_note) -> web.StreamResponse:
    """Send `body` a chunk at a time (each waits for the socket to drain), closing a client that takes
    longer than SEND_SECONDS."""
    response = web.StreamResponse(headers=headers)
    response.content_length = len(body)
    view = memoryview(body)
    try:
        await response.prepare(request)  # raises when the client reset while its page was rendered
        if request.method == "HEAD":  # the headers alone: a body would be read as the next answer
            await response.write_eof()
            return response
        async with asyncio.timeout(SEND_SECONDS):
            for start in range(0, len(body), SEND_CHUNK):
                await response.write(view[start:start + SEND_CHUNK])
    except TimeoutError:
        refused(f"did not read /metrics within {SEND_SECONDS:g} s; closed", request.remote)
        if request.transport is not None:
            request.transport.abort()
        return response  # aiohttp takes the closed transport as a client gone, quietly
    except ConnectionError:  # the client went away: nothing to answer; counted, logged rate-limited
        gone("went away before its /metrics answer was sent", request.remote)
        if request.transport is not None:
            request.transport.abort()
        return response
    await response.write_eof()
    return response
