"""Test support: the recorded engine samples, a fake server on a free port (serve_app), a misbehaving
engine over real HTTP, an agent that always stops (started_agent), the agent's own server as a task that
always stops (serve_task), and the golden-file check. Child processes: demo_procs.py."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import subprocess
import signal
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator
from unittest import mock

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rooflight.agent.cli import main, resolve_models
from rooflight.agent.metrics.exposition import registry_for
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import AgentConfig, build
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.serve import server

from ports import free_port  # noqa: F401  (tests import it from here too)

ROOT = Path(__file__).resolve().parents[1]  # the repository
TESTS = ROOT / "tests"
SAMPLES = TESTS / "fixtures" / "engine-samples"  # recorded real pages; provenance in its README.md
MODEL_CONFIGS = TESTS / "fixtures" / "model-configs"


def sample_text(name: str) -> str:
    """A recorded /metrics body, without its first `# source:` line."""
    text = (SAMPLES / name).read_text()
    return text.split("\n", 1)[1] if text.startswith("# source:") else text


async def serve_app(app: web.Application, port: int = 0, **runner_kwargs: Any) -> tuple[web.AppRunner, str]:
    """`app` served on 127.0.0.1:`port` (0: a free one, read back from the socket), so a test's fake server
    needs no port picked in advance: its runner (to clean up) and base URL."""
    runner = web.AppRunner(app, **runner_kwargs)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    sock = site._server.sockets[0]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{sock.getsockname()[1]}"


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
        self._runner, self.url = await serve_app(app, port, shutdown_timeout=0.1)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def rooflight_exe() -> str:
    """The `rooflight` console script of the Python running the tests: beside sys.executable (a venv's
    bin/, found even when that bin/ is not on PATH, as with `.venv/bin/python -m pytest`), else in this
    interpreter's scripts folder (a system python's /usr/local/bin), else on PATH."""
    import shutil
    import sys
    import sysconfig

    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        exe = folder / "rooflight"
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    found = shutil.which("rooflight")
    assert found, (f"the console script `rooflight` is not installed beside {sys.executable} nor on PATH: "
                   "pip install -e '.[test]' into the Python that runs the tests")
    return found


async def plan_from_live(page: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """`rooflight plan --from-live URL *argv`, run as a user runs it, at `page` served by a FakeEngine."""
    engine = FakeEngine(body=page)
    await engine.start()
    try:
        return await asyncio.to_thread(subprocess.run, [rooflight_exe(), "plan", "--from-live", engine.url, *argv],
                                       capture_output=True, text=True, timeout=120)
    finally:
        await engine.stop()


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any ROOFLIGHT_* setting (a developer's own must not leak into a
    test's command line), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOFLIGHT_")}
    env.update(extra)
    return env


def run_in_process(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`rooflight ARGV...` through the CLI's main in this process, given back as subprocess.run gives it: the
    exit code (argparse's exit too), stdout and stderr; `env` (default clean_env()) stands for the environment
    meanwhile. For commands that end on their own and leave nothing running (plan, rules, run --check-only): a
    child process spends about 0.5 s of CPU importing the agent, and the suite would start about 200 of them
    (docs/testing.md, How long the suite takes). The console script itself: tests/agent/test_cli.py."""
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        with mock.patch.dict(os.environ, clean_env() if env is None else env, clear=True), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exc:  # argparse: a bad flag, or --help
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if isinstance(exc.code, str):
                    err.write(exc.code)
    finally:  # main's logging.basicConfig must not outlive the call (its handler holds `err`)
        root.handlers[:] = handlers
        root.setLevel(level)
    return subprocess.CompletedProcess(["rooflight", *argv], code, out.getvalue(), err.getvalue())


STOP_WITHIN_S = 10.0  # a test's agent must stop within this: a hung stop fails the test, not the suite


@asynccontextmanager
async def started_agent(
    config: AgentConfig, *, loops: bool = True, stop_within: float = STOP_WITHIN_S, **agent_kwargs: Any
) -> AsyncIterator[Agent]:
    """An Agent built from `config` (models resolved as the CLI does, unless `models` is given),
    started, and always stopped on the way out, within `stop_within` seconds.

    `loops=False` starts no sampling task (the test drives sample_engines_once itself).
    """
    agent_kwargs.setdefault("models", resolve_models(config))
    agent = Agent(config, **agent_kwargs)
    await agent.start(loops=loops)
    try:
        yield agent
    finally:
        stopping = asyncio.ensure_future(agent.stop())
        done, _ = await asyncio.wait({stopping}, timeout=stop_within)  # never waits on a cancel, unlike wait_for
        assert done, f"agent.stop() did not finish within {stop_within} s"
        stopping.result()


Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # (name, sorted labels) -> value


def exported(agent: Agent) -> Metrics:
    """What the agent's /metrics would serve now, parsed back."""
    text = generate_latest(registry_for(lambda: agent.snapshot)).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@dataclass
class Rig:
    """An agent on a fake clock against a FakeEngine whose page each test rewrites between samples."""

    engine: FakeEngine
    agent: Agent
    clock: FakeClock
    interval: float

    async def sample(self, page: str) -> Metrics:
        self.engine.body = page
        self.clock.advance(self.interval)
        await self.agent.sample_engines_once()
        return exported(self.agent)


@asynccontextmanager
async def scripted_agent(page: str, interval: float = 0.5, **settings: Any) -> AsyncIterator[Rig]:
    """One vLLM-like FakeEngine serving `page` and an agent sampled by hand (windows 5s,30s, batch cap
    256, the 8B's constants, no NVML or process source); `settings` override any of those."""
    engine = FakeEngine(body=page)
    await engine.start()
    config = build({}, {}, {"engine_url": [engine.url], "process": False, "nvml": False, "interval": str(interval),
                            "windows": "5s,30s", "model": "llama-3-8b", "batch_max": 256, **settings})
    clock = FakeClock()
    try:
        async with started_agent(config, loops=False, clock=clock) as agent:
            yield Rig(engine, agent, clock, interval)
    finally:
        await engine.stop()


@asynccontextmanager
async def serve_task(agent: Agent, port: int, **serve_kwargs: Any) -> AsyncIterator[asyncio.Task[None]]:
    """serve() (the agent's own server, as `rooflight run` runs it) on 127.0.0.1:`port` as a task. On the way
    out it is cancelled and awaited, and the signal handlers it installs (SIGINT and SIGTERM; SIGHUP with
    `security`) are removed, so no later test's event loop inherits them."""
    task = asyncio.create_task(server.serve(agent, "127.0.0.1", port, **serve_kwargs))
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)


GOLDEN = TESTS / "golden"


GOLDEN_OUT_ENV = "ROOFLIGHT_GOLDEN_OUT"  # set only by tests/regen_goldens.py: where to put what the tests produce


def check_golden(path: Path, text: str) -> None:
    """`text` must equal the golden file, always: a test never writes the file it compares with.

    To change a golden on purpose, run `python tests/regen_goldens.py` and read `git diff tests/golden`.
    Under that command (ROOFLIGHT_GOLDEN_OUT set) the text is also written to that folder, and the
    command copies it over the golden afterwards.
    """
    import difflib

    assert "ROOFLIGHT_UPDATE_GOLDEN" not in os.environ, (
        "ROOFLIGHT_UPDATE_GOLDEN is gone: regenerate goldens with `python tests/regen_goldens.py`")
    out = os.environ.get(GOLDEN_OUT_ENV)
    if out:
        produced = Path(out) / path.relative_to(GOLDEN)
        produced.parent.mkdir(parents=True, exist_ok=True)
        produced.write_text(text)
    assert path.exists(), f"no golden file {path}; write it with `python tests/regen_goldens.py`"
    expected = path.read_text()
    if text != expected:
        diff = difflib.unified_diff(expected.splitlines(), text.splitlines(), "golden", "now", lineterm="", n=0)
        shown = "\n".join(list(diff)[:40])
        raise AssertionError(f"exposition differs from {path} (regenerate: python tests/regen_goldens.py):\n{shown}")


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


def with_energy(windows: Any, watts_for: Any) -> tuple[Any, ...]:
    """The windows with energy_watts set from `watts_for(window seconds)`, as the derive step sets it from the
    GPUs' energy counter (agent/signals/series.py): for tests that hand-build windows."""
    from dataclasses import replace

    return tuple(replace(w, energy_watts=watts_for(w.seconds)) for w in windows)
