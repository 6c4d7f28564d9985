"""Test support: the recorded engine samples, and a misbehaving engine over real HTTP."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]  # the repository
TESTS = ROOT / "tests"
SAMPLES = TESTS / "fixtures" / "engine-samples"  # recorded real pages; provenance in its README.md
MODEL_CONFIGS = TESTS / "fixtures" / "model-configs"


def sample_text(name: str) -> str:
    """A recorded /metrics body, without its first `# source:` line."""
    text = (SAMPLES / name).read_text()
    return text.split("\n", 1)[1] if text.startswith("# source:") else text


@dataclass
class FakeEngine:
    """An HTTP engine on 127.0.0.1 whose answers a test changes as it goes."""

    body: str = ""
    status: int = 200
    delay: float = 0.0
    hang: bool = False
    json_routes: dict[str, object] = field(default_factory=dict)
    requests: int = 0
    url: str = ""
    _runner: web.AppRunner | None = None

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        if self.hang:
            await asyncio.sleep(3600)
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.Response(status=self.status, text=self.body, content_type="text/plain")

    async def _json(self, request: web.Request) -> web.Response:
        data = self.json_routes.get(request.path)
        if data is None:
            return web.Response(status=404)
        return web.json_response(data)

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/{tail:.*}", self._json)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


GOLDEN = TESTS / "golden"


def check_golden(path: Path, text: str) -> None:
    """`text` must equal the golden file; ROOFLIGHT_UPDATE_GOLDEN=1 rewrites it (then read the diff)."""
    import os

    if os.environ.get("ROOFLIGHT_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with ROOFLIGHT_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"exposition differs from {path}"


def promtool_clean(text: str) -> None:
    """`promtool check metrics` passes on `text` (Debian's prometheus package; CI installs it)."""
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install Debian's prometheus package (CI does)"
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def synthetic_page(name: str) -> str:
    """A synthetic /metrics page from `engine-samples/synthetic/<name>.prom` (provenance in its README),
    without its first `# source:` line: for what no recording shows (TGI, a full trtllm-serve page, ...)."""
    return sample_text(f"synthetic/{name}.prom")
