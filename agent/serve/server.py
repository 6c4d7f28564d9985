"""The agent's HTTP face: /metrics, health and readiness, a landing page, and a JSON snapshot.

Every handler reads the current frozen Snapshot; none waits on a source. Engine targets come only from
configuration: no request parameter can make the agent fetch a URL.
"""

from __future__ import annotations

import asyncio
import html
import signal
from typing import Any, AsyncIterator
from urllib.parse import urlsplit, urlunsplit

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from rooflight.agent import __version__
from rooflight.agent.metrics.exposition import registry_for
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.metrics.snapshot import Snapshot

AGENT_KEY = web.AppKey("agent", Agent)


def build_app(agent: Agent, *, manage_agent: bool = True, **app_kwargs: Any) -> web.Application:
    app = web.Application(client_max_size=64 * 1024, **app_kwargs)
    app[AGENT_KEY] = agent
    registry = registry_for(lambda: agent.snapshot)
    app.router.add_get("/metrics", make_aiohttp_handler(registry))
    app.router.add_get("/", landing)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", ready)
    app.router.add_get("/api/v1/snapshot", snapshot_json)
    if manage_agent:
        app.cleanup_ctx.append(_agent_lifecycle)
    return app


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
    """A URL without user:password, for anything the agent shows."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def snapshot_dict(snap: Snapshot) -> dict[str, Any]:
    """The snapshot as plain data: only what /metrics shows, in a shape a script can read."""
    return {
        "created": snap.created,
        "health": [
            {"source": h.source, "target": h.target, "up": h.up, "last_success": h.last_success,
             "duration": h.duration, "errors": dict(h.errors)}
            for h in snap.health
        ],
        "targets": [_target_dict(t) for t in snap.targets],
        "gpus": [
            {"index": d.index, "uuid": d.uuid, "name": d.name, "memory_used_bytes": d.memory_used_bytes,
             "memory_total_bytes": d.memory_total_bytes, "kernel_residency_ratio": d.kernel_residency_ratio,
             "dram_bandwidth_utilization_ratio": d.dram_bandwidth_utilization_ratio}
            for d in (snap.gpu.devices if snap.gpu else ())
        ],
    }


def _target_dict(t: Any) -> dict[str, Any]:
    c = t.constants
    return {
        "name": t.name,
        "engine": t.engine,
        "gpu_profile": c.gpu.key if c else None,
        "gpu_profile_source": c.gpu_source if c else None,
        "tensor_parallel_size": c.tensor_parallel_size if c else None,
        "model": c.model.name if c and c.model else None,
        "model_source": t.model_source,
        "series": [
            {
                "model": v.series.model,
                "rank": v.series.rank,
                "running": v.series.running,
                "waiting": v.series.waiting,
                "kv_usage_ratio": v.series.kv_usage_ratio,
                "batch_max": v.batch_max,
                "windows": [
                    {"window": w.window, "seconds": w.seconds, "tokens_per_second": dict(w.tokens_per_second),
                     "steps_per_second": w.steps_per_second, "mbu": w.mbu, "mfu": dict(w.mfu),
                     "decode_intensity": w.decode_intensity, "ttft": dict(w.ttft), "itl": dict(w.itl),
                     "preemptions_per_second": w.preemptions_per_second}
                    for w in v.windows
                ],
                "verdicts": _verdicts_dict(v.verdicts),
            }
            for v in t.series
        ],
    }


def _verdicts_dict(verdicts: Any) -> dict[str, Any] | None:
    if verdicts is None:
        return None
    keys = ("head_of_line", "itl_inflation", "capacity_capped", "admission_bound", "at_configured_max")
    return {k: getattr(verdicts, k, None) for k in keys}


async def snapshot_json(request: web.Request) -> web.Response:
    return web.json_response(snapshot_dict(request.app[AGENT_KEY].snapshot))


async def landing(request: web.Request) -> web.Response:
    snap = request.app[AGENT_KEY].snapshot
    rows = []
    for t in snap.targets:
        for v in t.series:
            short = v.windows[0] if v.windows else None
            mbu = f"{short.mbu:.1%}" if short and short.mbu is not None else "n/a"
            mfu = f"{short.mfu.get('prefill', 0):.1%}" if short and short.mfu else "n/a"
            rows.append(
                f"<tr><td>{html.escape(t.name)}</td><td>{html.escape(t.engine or '?')}</td>"
                f"<td>{html.escape(v.series.model)}</td><td>{v.series.running}</td><td>{v.series.waiting}</td>"
                f"<td>{mbu}</td><td>{mfu}</td></tr>"
            )
    health = "".join(
        f"<li>{html.escape(h.source)} {html.escape(h.target)}: {'up' if h.up else 'DOWN'}</li>" for h in snap.health
    )
    body = f"""<!doctype html><html><head><meta charset="utf-8"><title>Rooflight</title></head><body>
<h1>Rooflight {__version__}</h1>
<p>Judge decode by MBU, prefill by MFU. <a href="/metrics">/metrics</a> ·
<a href="/api/v1/snapshot">/api/v1/snapshot</a> · <a href="/-/healthy">/-/healthy</a></p>
<h2>Sources</h2><ul>{health}</ul>
<h2>Targets (shortest window)</h2>
<table border="1" cellpadding="4"><tr><th>target</th><th>engine</th><th>model</th><th>running</th>
<th>waiting</th><th>decode MBU</th><th>prefill MFU</th></tr>{''.join(rows)}</table>
</body></html>"""
    return web.Response(text=body, content_type="text/html")


# Request limits on the agent's own endpoints: nothing it serves needs a long URL or many headers.
MAX_LINE_SIZE = 4096
MAX_FIELD_SIZE = 4096
MAX_HEADERS = 64


async def serve(agent: Any, host: str, port: int, *, security: Any = None) -> None:
    """Serve the agent until SIGINT/SIGTERM; `security` (webconfig.WebSecurity) adds TLS and auth."""
    middlewares = [security.middleware] if security is not None else []
    ssl_context = security.ssl_context if security is not None else None
    runner = web.AppRunner(build_app(agent, middlewares=middlewares), access_log=None, handle_signals=False,
                           max_line_size=MAX_LINE_SIZE, max_field_size=MAX_FIELD_SIZE, max_headers=MAX_HEADERS)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    if security is not None:
        security.install_sighup(asyncio.get_running_loop())
    scheme = "https" if ssl_context else "http"
    shown = f"[{host}]" if ":" in host else host
    print(f"rooflight {__version__}: serving {scheme}://{shown}:{port}/metrics", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
