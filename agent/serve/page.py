"""The status page at `/`, the roofline at `/roofline.svg` and the page's data at `/api/v1/status`.

The page is static HTML, CSS and a small script shipped in the package (agent/serve/static/): no CDN,
no build step, nothing fetched from elsewhere, so it works on an air-gapped host. The script polls
`api/v1/status` and `roofline.svg` about once a second while the tab is visible. Everything is computed
from the current Snapshot when a client asks, once per snapshot however many ask (the status dict and
its JSON are kept for the snapshot they were built from), on a thread of its own, not on the event loop:
pollers then cost neither the health checks nor the scrapes their time. Nothing runs on the sampling path. The routes sit in the same
app as /metrics, so the web config's TLS and basic auth cover them like every other endpoint.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import threading
from functools import lru_cache
from importlib import resources

from typing import Any

from aiohttp import web

from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.serve.roofline_svg import STYLE as SVG_STYLE
from rooflight.agent.serve.roofline_svg import render_roofline
from rooflight.agent.serve.status import History, find_target, status_dict
from rooflight.collectors.daemon_executor import DaemonThreadExecutor

STATUS_AGENT_KEY = web.AppKey("status_agent", Agent)
STATUS_HISTORY_KEY = web.AppKey("status_history", History)
MAX_TARGET_NAME = 256  # a target name in ?target=; longer is no name the agent has
NO_STORE = {"Cache-Control": "no-store"}
# The snapshot a response was drawn from (its `created`, as /api/v1/status writes it): the page pairs the
# status with charts of the same snapshot, where a sample landing between its fetches would pair a chart
# with the numbers of the sample before.
SNAPSHOT_HEADER = "X-Rooflight-Snapshot"


def _snapshot(status: dict[str, Any]) -> dict[str, str]:
    return {SNAPSHOT_HEADER: json.dumps(status.get("created"))}


class StatusCache:
    """The status dict and its JSON for the latest snapshot: built once (recording the history once) and
    shared by every poller; built on the status thread only."""

    def __init__(self, agent: Agent, history: History) -> None:
        self._agent, self._history = agent, history
        self._snapshot: object = None
        self._status: dict[str, Any] = {}
        self._json: bytes = b""
        self._lock = threading.Lock()

    def current(self) -> tuple[dict[str, Any], bytes]:
        with self._lock:
            snap = self._agent.snapshot
            if snap is not self._snapshot:
                status = status_dict(snap, self._history)
                self._status, self._json = status, json.dumps(status, separators=(",", ":")).encode()
                self._snapshot = snap
            return self._status, self._json


STATUS_CACHE_KEY = web.AppKey("status_cache", StatusCache)
_STATUS_POOL: list[DaemonThreadExecutor] = []  # made on the first request: importing starts no thread


async def _current(request: web.Request) -> tuple[dict[str, Any], bytes]:
    if not _STATUS_POOL:
        _STATUS_POOL.append(DaemonThreadExecutor("rooflight-status"))
    return await asyncio.get_running_loop().run_in_executor(_STATUS_POOL[0], request.app[STATUS_CACHE_KEY].current)


def add_status_routes(app: web.Application, agent: Agent) -> None:
    """Register `/` (the status page), `/roofline.svg` and `/api/v1/status` on `app`, for `agent`."""
    app[STATUS_AGENT_KEY] = agent
    app[STATUS_HISTORY_KEY] = History(agent.sparklines)
    app[STATUS_CACHE_KEY] = StatusCache(agent, app[STATUS_HISTORY_KEY])
    app.router.add_get("/", status_page)
    app.router.add_get("/roofline.svg", roofline_svg)
    app.router.add_get("/api/v1/status", status_json)


@lru_cache(maxsize=1)
def page_html() -> str:
    """The page with its stylesheet and script inlined: one response, no further asset requests."""
    static = resources.files("rooflight.agent.serve") / "static"
    html = (static / "status.html").read_text(encoding="utf-8")
    css = (static / "status.css").read_text(encoding="utf-8")
    js = (static / "status.js").read_text(encoding="utf-8")
    return html.replace("/*STATUS_CSS*/", css).replace("/*STATUS_JS*/", js)


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@lru_cache(maxsize=1)
def page_csp() -> str:
    """The page's Content-Security-Policy: its own inline script and styles by hash (and the chart's style,
    which arrives inside the fetched SVG), fetches to this agent only, no frames, forms or plugins."""
    html = page_html()
    scripts = [_sha256(m) for m in re.findall(r"<script>(.*?)</script>", html, re.S)]
    styles = [_sha256(m) for m in re.findall(r"<style>(.*?)</style>", html, re.S)] + [_sha256(SVG_STYLE)]
    return (f"default-src 'none'; script-src {' '.join(scripts)}; style-src {' '.join(styles)}; "
            "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


SVG_CSP = f"default-src 'none'; style-src {_sha256(SVG_STYLE)}; frame-ancestors 'none'"


async def status_page(request: web.Request) -> web.Response:
    return web.Response(text=page_html(), content_type="text/html", charset="utf-8",
                        headers={"Content-Security-Policy": page_csp()})


async def status_json(request: web.Request) -> web.Response:
    status, body = await _current(request)
    return web.Response(body=body, content_type="application/json", headers={**NO_STORE, **_snapshot(status)})


async def roofline_svg(request: web.Request) -> web.Response:
    """The chart of `?target=NAME` (default: the first target); 404 for a name the agent does not have."""
    name = request.query.get("target")
    if name is not None and len(name) > MAX_TARGET_NAME:
        raise web.HTTPNotFound(text="no such target\n")
    status, _ = await _current(request)
    target = find_target(status, name)
    if target is None and name is not None:
        raise web.HTTPNotFound(text="no such target\n")
    return web.Response(text=render_roofline(target), content_type="image/svg+xml", charset="utf-8",
                        headers={**NO_STORE, **_snapshot(status), "Content-Security-Policy": SVG_CSP})
