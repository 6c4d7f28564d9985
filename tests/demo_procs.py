"""`rooflight` run as a user runs it, in processes of its own: a demo (or any subcommand) started, and any
child process stopped the same way every time (SIGTERM, a bounded wait, then SIGKILL; an asyncio child
killed), so no test leaves one behind and a failing test can show what the child wrote on stderr."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

import aiohttp

from support import rooflight_exe


def rooflight_command() -> list[str]:
    """The installed console script, as a user runs it (support.rooflight_exe finds it)."""
    return [rooflight_exe()]


def start_rooflight(*args: str) -> subprocess.Popen[bytes]:
    """`rooflight ARGS...` in its own process; stdout dropped, stderr kept for stop_process()."""
    return subprocess.Popen([*rooflight_command(), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def start_demo(scenario: str, listen: str, engine_listen: str, *, seed: int | None = None,
               extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """`rooflight demo` on `listen` (the agent) and `engine_listen` (the simulated engine), sampling every
    1 s, quiet but for warnings; `seed` as given, else the demo's own; `extra` flags after those."""
    seeded = ("--seed", str(seed)) if seed is not None else ()
    return start_rooflight("demo", "--scenario", scenario, *seeded, "--listen", listen,
                           "--engine-listen", engine_listen, "--interval", "1s", "--log-level", "warning", *extra)


def stop_process(proc: subprocess.Popen[bytes], *, grace: float = 10.0) -> str:
    """Stop `proc` (SIGTERM, up to `grace` seconds, then SIGKILL) unless it has exited; what it wrote on
    stderr (empty when stderr was not a pipe, or was read by an earlier call: calling twice is safe)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    if proc.stderr is None or proc.stderr.closed:
        return ""
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    return err


@asynccontextmanager
async def async_child(*argv: str, env: dict[str, str] | None = None) -> AsyncIterator[asyncio.subprocess.Process]:
    """`argv` as an asyncio child, stdout and stderr piped; killed on the way out unless it has exited, so
    a test that stops it itself (and asserts how it exited) leaves nothing behind when it fails first."""
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


HEALTHY_WITHIN_S = 60.0  # a child that spawns, imports and binds, on a busy machine; proxy workers take ~3 s here


async def wait_healthy(session: aiohttp.ClientSession, url: str,
                       child: asyncio.subprocess.Process | None = None) -> None:
    """Until `url` answers 200: a child that spawns, imports and binds (HEALTHY_WITHIN_S). A `child`
    that exits first (a port taken between free_port() and its bind, say) fails at once with what it said on
    stderr, where polling its port went on for the whole minute."""
    deadline = time.monotonic() + HEALTHY_WITHIN_S  # by the clock: a poll held by the session's timeout counts too
    while time.monotonic() < deadline:
        if child is not None and child.returncode is not None:
            said = await child.stderr.read() if child.stderr is not None else b""
            raise AssertionError(f"the child exited {child.returncode} before {url} answered: {said[-2000:]!r}")
        try:
            async with session.get(url) as r:
                if r.status == 200:
                    return
        except (aiohttp.ClientError, TimeoutError):  # not listening yet, or something else on the port
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never answered within {HEALTHY_WITHIN_S:g} s")
