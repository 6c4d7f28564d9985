"""A throwaway real Prometheus (Debian's 2.42 binary) that scrapes given targets every second.

Minimal local stand-in for tests/promstack.py (not present when this was written): a config file,
a TSDB dir and the process in the run dir, stopped by PID through procs.ManagedProcess; queries go
to /api/v1/query over real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
from pathlib import Path

from procs import ManagedProcess, free_port, http_text


def prometheus_process(run_dir: Path, name: str, targets: dict[str, str]) -> ManagedProcess:
    """targets: job name -> host:port. Scrape and evaluation interval 1 s."""
    exe = shutil.which("prometheus")
    assert exe, "Debian's prometheus is not installed (apt-get install prometheus)"
    base = run_dir / f"prom-{name}"
    base.mkdir(parents=True, exist_ok=True)
    jobs = "".join(
        f"  - job_name: {job}\n    static_configs: [{{targets: ['{addr}']}}]\n"
        for job, addr in targets.items()
    )
    cfg = base / "prometheus.yml"
    cfg.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s, scrape_timeout: 1s}\n"
                   f"scrape_configs:\n{jobs}")
    port = free_port()
    argv = [exe, f"--config.file={cfg}", f"--storage.tsdb.path={base / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}"]
    return ManagedProcess(name=f"prometheus-{name}", argv=argv, log_path=base / "prometheus.log",
                          port=port, tmpdir=base / "tmp")


def query(port: int, expr: str, at: float | None = None) -> list[dict]:
    """Instant query; returns data.result (a list of {metric, value: [t, "v"]})."""
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode(params)
    body = json.loads(http_text(url))
    assert body["status"] == "success", body
    return body["data"]["result"]


def scalar(port: int, expr: str, at: float | None = None) -> float | None:
    result = query(port, expr, at)
    return float(result[0]["value"][1]) if result else None


def scraped_after(port: int, metric: str, t: float) -> bool:
    """Whether Prometheus' latest sample of `metric` was scraped after t (time.time())."""
    scraped = scalar(port, f"max(timestamp({metric}))")
    return scraped is not None and scraped > t


def wait_for_samples(port: int, expr: str, timeout: float = 30.0) -> None:
    """Until expr returns something (the first scrape lands ~5 s after start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if query(port, expr):
            return
        time.sleep(0.5)
    raise TimeoutError(f"Prometheus has no result for {expr} after {timeout}s")
