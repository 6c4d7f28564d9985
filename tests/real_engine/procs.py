"""Start and stop the real-engine stage's processes by PID: vLLM, the agent, Prometheus.

Owns process hygiene for tests/real_engine: free ports on 127.0.0.1, one log file per process, a
per-start TMPDIR for vLLM (it leaves ZMQ sockets and a vllm_dist_* file in the temp dir even after a
clean shutdown), readiness polling that notices a dead process, and a stop that signals the PID we
started, then every descendant it had (vLLM's engine core and worker), and checks the port is free.
Nothing here is killed by name.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ports import free_port  # noqa: F401  (the stage's modules import it from here)
from support import rooflight_exe


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return 200 <= r.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def http_text(url: str, timeout: float = 30.0) -> str:
    """The page at url. The timeout is each socket operation's, past the 15-16 s a CI host once stalled for."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode("utf-8")


class ProcessDied(RuntimeError):
    pass


@dataclass
class ManagedProcess:
    """One process we started, with its log; stop() is safe to call twice."""

    name: str
    argv: list[str]
    log_path: Path
    port: int
    env: dict[str, str] = field(default_factory=dict)
    tmpdir: Path | None = None
    env_drop_prefixes: tuple[str, ...] = ()  # inherited variables to hide from it
    popen: subprocess.Popen | None = None
    started_at: float = 0.0
    ready_after_s: float | None = None
    _descendants: set[int] = field(default_factory=set)

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} not started"
        return self.popen.pid

    def start(self) -> "ManagedProcess":
        full_env = {k: v for k, v in os.environ.items()
                    if not (self.env_drop_prefixes and k.startswith(self.env_drop_prefixes))}
        full_env.update(self.env)
        if self.tmpdir is not None:
            self.tmpdir.mkdir(parents=True, exist_ok=True)  # must exist, or Python falls back to /tmp
            full_env["TMPDIR"] = str(self.tmpdir)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.started_at = time.monotonic()
        # Own session: a Ctrl-C in the terminal does not reach it; we stop it ourselves by PID.
        self.popen = subprocess.Popen(
            self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=full_env, start_new_session=True,
        )
        log.close()
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_http(self, url: str, timeout: float) -> float:
        """Poll url until 2xx; raise ProcessDied/TimeoutError with the log tail. Returns seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._remember_descendants()
            if http_ok(url):
                self.ready_after_s = time.monotonic() - self.started_at
                return self.ready_after_s
            if not self.alive():
                raise ProcessDied(f"{self.name} exited rc={self.popen.returncode}:\n{self.log_tail()}")
            time.sleep(0.25)
        raise TimeoutError(f"{self.name} not ready at {url} after {timeout}s:\n{self.log_tail()}")

    def _remember_descendants(self) -> None:
        if not self.alive():
            return
        try:
            for child in psutil.Process(self.pid).children(recursive=True):
                self._descendants.add(child.pid)
        except psutil.Error:
            pass

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the PID, wait, SIGKILL it if needed, then any descendant still alive; free the port."""
        if self.popen is None:
            return
        self._remember_descendants()
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        self._reap_descendants(grace=10.0)
        deadline = time.monotonic() + 10
        while not port_is_free(self.port) and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def _reap_descendants(self, grace: float) -> None:
        procs = []
        for pid in self._descendants:
            try:
                procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
        if not procs:
            return
        _, alive = psutil.wait_procs(procs, timeout=grace)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)

    def leftovers(self) -> list[int]:
        """PIDs of this process and its descendants that are still running (should be [] after stop)."""
        out = []
        for pid in ({self.pid} if self.popen else set()) | self._descendants:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
            except psutil.NoSuchProcess:
                continue
        return out


VLLM_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",  # keep vLLM's internal ZMQ address on loopback
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the smallest explicit value
}


def vllm_process(
    python: str, model_dir: Path, run_dir: Path, name: str, port: int, extra: list[str]
) -> ManagedProcess:
    """vLLM's OpenAI server on 127.0.0.1:port (module entry point: the `vllm` CLI is broken in vllm-cpu)."""
    argv = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", "tiny-llama",
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--enforce-eager",
        *extra,
    ]
    return ManagedProcess(
        name=f"vllm-{name}", argv=argv, log_path=run_dir / f"vllm-{name}-{port}.log", port=port,
        env=dict(VLLM_ENV), tmpdir=run_dir / f"tmp-vllm-{name}-{port}",
    )


def agent_process(
    engine_port: int, model_dir: Path, run_dir: Path, name: str, port: int,
    gpu: str = "h100-sxm", interval: float = 0.5, batch_max: int | None = None, extra: tuple[str, ...] = (),
) -> ManagedProcess:
    """The rooflight agent (system python's console script) against one engine."""
    exe = rooflight_exe()
    argv = [
        exe, "run", "--engine-url", f"http://127.0.0.1:{engine_port}",
        "--model-config", str(model_dir / "config.json"), "--gpu", gpu,
        "--listen", f"127.0.0.1:{port}", "--interval", str(interval), "--no-nvml",
    ]
    if batch_max is not None:
        argv += ["--batch-max", str(batch_max)]
    argv += list(extra)
    return ManagedProcess(
        name=f"agent-{name}", argv=argv, log_path=run_dir / f"agent-{name}-{port}.log", port=port,
        env_drop_prefixes=("ROOFLIGHT_",),  # every ROOFLIGHT_* variable is an agent setting
    )
