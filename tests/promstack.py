"""A real Prometheus for tests: Debian's `prometheus` binary on a free 127.0.0.1 port, in a temp dir.

    with PromStack(targets=["127.0.0.1:9400"], rule_files=[Path("rules/x.yaml")]) as prom:
        prom.wait_for('up == 1')                      # first sample lands ~5 s after start
        rows = prom.query('rooflight_mbu_ratio')      # instant query -> list of {"metric", "value"}
        prom.query_range('rate(x[10s])', start, end, step=1)

Scrape and rule evaluation run every second (`interval`). Rule files are copied into the temp dir and
listed in the config, so alerts and recording rules evaluate as they would in production. The server
is stopped by PID (graceful SIGTERM, then SIGKILL) and its temp dir removed. No network beyond
127.0.0.1, no global state: several stacks can run at once.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from ports import free_port

PROMETHEUS = "prometheus"


class PromError(RuntimeError):
    """Prometheus answered with an error (status, errorType, error) or never became ready."""


def available() -> bool:
    """Whether the prometheus binary is on PATH."""
    return shutil.which(PROMETHEUS) is not None


def wait_ready(proc: subprocess.Popen[bytes], url: str, timeout: float, log: Callable[[], str]) -> bool:
    """Until `url` (a server's /-/ready) answers 200: True; False after `timeout`; PromError with the tail of
    `log()` as soon as the server exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PromError(f"{proc.args[0]} exited with {proc.returncode}: {log()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    return False


def stop_server(proc: subprocess.Popen[bytes] | None, folder: Path | None) -> None:
    """A server stopped by PID (SIGTERM, 10 s, then SIGKILL) and its temp dir removed."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


class PromAPI:
    """The Prometheus HTTP API at `url`: a Prometheus, or anything that speaks its API (VictoriaMetrics)."""

    url: str

    def describe(self) -> str:
        """What a failed wait_for adds to its message."""
        return ""

    def api(self, path: str, params: dict[str, str]) -> Any:
        """GET /api/v1/<path>; returns `data`, raises PromError on an error answer (e.g. a parse error)."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read() or b"{}")
        if body.get("status") != "success":
            raise PromError(f"{body.get('errorType')}: {body.get('error')} ({params.get('query', path)})")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; a vector's samples (scalars come back as one sample with no labels)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = repr(at)
        data = self.api("query", params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        data = self.api("query_range", {"query": expr, "start": repr(start), "end": repr(end), "step": repr(step)})
        return list(data["result"])

    def wait_for(self, expr: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Poll an instant query until it returns samples; raises PromError with the last answer."""
        deadline = time.monotonic() + timeout
        last: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            last = self.query(expr)
            if last:
                return last
            time.sleep(0.25)
        raise PromError(f"no samples for {expr!r} after {timeout}s; {self.describe()}")


class PromStack(PromAPI):
    """One Prometheus server scraping `targets` (host:port, path /metrics) and evaluating `rule_files`."""

    def __init__(
        self,
        targets: Sequence[str],
        rule_files: Sequence[Path] = (),
        *,
        interval: str = "1s",
        metrics_path: str = "/metrics",
        ready_timeout: float = 30.0,
        scrape_configs: Sequence[dict[str, Any]] | None = None,
        alertmanagers: Sequence[str] = (),
        flags: Sequence[str] = (),
    ) -> None:
        self.targets = list(targets)
        self.rule_files = [Path(p) for p in rule_files]
        self.interval = interval
        self.metrics_path = metrics_path
        self.ready_timeout = ready_timeout
        self.scrape_configs = list(scrape_configs) if scrape_configs is not None else None  # instead of `targets`
        self.alertmanagers = list(alertmanagers)  # host:port of each Alertmanager the alerts are sent to
        self.flags = list(flags)
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self, rule_names: Sequence[str]) -> dict[str, Any]:
        config: dict[str, Any] = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval,
                       "scrape_timeout": self.interval},
            "rule_files": list(rule_names),
            "scrape_configs": self.scrape_configs if self.scrape_configs is not None else [{
                "job_name": "test",
                "metrics_path": self.metrics_path,
                "static_configs": [{"targets": self.targets}],
            }],
        }
        if self.alertmanagers:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": self.alertmanagers}]}]}
        return config

    def start(self) -> "PromStack":
        self.dir = Path(tempfile.mkdtemp(prefix="promstack-"))
        names = []
        for i, rule in enumerate(self.rule_files):
            name = f"rules-{i}-{rule.name}"
            shutil.copyfile(rule, self.dir / name)
            names.append(name)
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(self.config(names)), encoding="utf-8")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle", "--log.level=warn",
             *self.flags],
            stdout=subprocess.DEVNULL, stderr=open(self.dir / "prometheus.log", "wb"),
        )
        if wait_ready(self.proc, f"{self.url}/-/ready", self.ready_timeout, self.log):
            return self
        self.stop()
        raise PromError(f"prometheus not ready after {self.ready_timeout}s")

    def log(self) -> str:
        path = self.dir / "prometheus.log" if self.dir else None
        return path.read_text(encoding="utf-8", errors="replace") if path and path.exists() else ""

    def stop(self) -> None:
        stop_server(self.proc, self.dir)
        self.proc, self.dir = None, None

    def __enter__(self) -> "PromStack":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def targets_health(self) -> list[dict[str, Any]]:
        return list(self.api("targets", {})["activeTargets"])

    def describe(self) -> str:
        return f"targets: {self.targets_health()}"
