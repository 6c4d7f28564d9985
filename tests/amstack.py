"""A real Alertmanager for tests, and the webhook it notifies: Debian's `prometheus-alertmanager` on a free
127.0.0.1 port, in a temp dir, its clustering off; a receiver of the test's own that records every
notification as it arrives.

    with Webhook() as hook, AMStack(config(urls=hook.urls(("pager", "ticket")))) as am:
        ...                       # point Prometheus at am.address
        hook.posts                # every notification, in order of arrival

The Alertmanager is stopped by PID (SIGTERM, then SIGKILL) and its temp dir removed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from promstack import PromError, free_port, stop_server, wait_ready

ALERTMANAGER = "prometheus-alertmanager"


def available() -> bool:
    return shutil.which(ALERTMANAGER) is not None and shutil.which("amtool") is not None


@dataclass(frozen=True)
class Post:
    """One notification: the receiver whose URL it came to, when, and Alertmanager's webhook payload."""

    receiver: str
    at: float  # time.monotonic() at arrival
    body: dict[str, Any]


class Webhook:
    """An HTTP server on 127.0.0.1 that records each POST to /<receiver> (Alertmanager's webhook_config)."""

    def __init__(self) -> None:
        self.posts: list[Post] = []
        self._lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                with hook._lock:
                    hook.posts.append(Post(self.path.strip("/"), time.monotonic(), body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook", daemon=True)

    def urls(self, receivers: tuple[str, ...]) -> dict[str, str]:
        port = self._server.server_address[1]
        return {r: f"http://127.0.0.1:{port}/{r}" for r in receivers}

    def received(self) -> list[Post]:
        with self._lock:
            return list(self.posts)

    def __enter__(self) -> "Webhook":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class AMStack:
    """One Alertmanager running `config` (a dict), alone: no cluster peers."""

    def __init__(self, config: dict[str, Any], ready_timeout: float = 30.0) -> None:
        self.config = config
        self.ready_timeout = ready_timeout
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "AMStack":
        self.dir = Path(tempfile.mkdtemp(prefix="amstack-"))
        (self.dir / "alertmanager.yml").write_text(yaml.safe_dump(self.config), encoding="utf-8")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [ALERTMANAGER, f"--config.file={self.dir / 'alertmanager.yml'}", f"--storage.path={self.dir / 'data'}",
             f"--web.listen-address={self.address}", "--cluster.listen-address=", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(self.dir / "alertmanager.log", "wb"),
        )
        if wait_ready(self.proc, f"http://{self.address}/-/ready", self.ready_timeout, self.log):
            return self
        self.stop()
        raise PromError(f"alertmanager not ready after {self.ready_timeout}s")

    def log(self) -> str:
        path = self.dir / "alertmanager.log" if self.dir else None
        return path.read_text(encoding="utf-8", errors="replace") if path and path.exists() else ""

    def stop(self) -> None:
        stop_server(self.proc, self.dir)
        self.proc, self.dir = None, None

    def __enter__(self) -> "AMStack":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
