"""Basic auth under attack, over real HTTP on 127.0.0.1.

A flood of wrong passwords from one address must cost that address, not every other client's login;
a web config that configures nothing stops the start; a client looping on 429 is slowed down,
not answered as fast as it asks; a wrong password costs the same whatever the user's bcrypt cost.
Loopback has all of 127.0.0.0/8, so a second client address is a connector bound to 127.0.0.2.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import subprocess
import sys
import time
from pathlib import Path
from contextlib import asynccontextmanager
from typing import AsyncIterator

import aiohttp
import bcrypt
import pytest

from rooflight.agent.config.agent import build
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.serve import webconfig
from support import ROOT, free_port, serve_task

PASSWORD = "correct horse battery staple"


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _agent() -> Agent:
    return Agent(build({}, {}, {"engine_url": ["http://127.0.0.1:9"], "nvml": False, "process": False,
                                "interval": "1", "windows": "10s", "scrape_timeout": "0.3"}))


@pytest.fixture
def served(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A factory: serve() behind a web config with `users` (name -> hash), yielding the base URL; with
    `check_seconds`, every password check takes that long (a slow machine, or a high bcrypt cost)."""

    @asynccontextmanager
    async def _up(users: dict[str, str], check_seconds: float = 0.0) -> AsyncIterator[str]:
        path = tmp_path / "web.yml"
        path.write_text("basic_auth_users:\n" + "".join(f"  {u}: '{h}'\n" for u, h in users.items()))
        security = webconfig.WebSecurity(path)
        if check_seconds:
            real = security.auth._verify
            security.auth._verify = lambda p, h: time.sleep(check_seconds) or real(p, h)  # type: ignore[method-assign]
        port = free_port()
        async with serve_task(_agent(), port, security=security):
            base = f"http://127.0.0.1:{port}"
            for _ in range(200):
                try:
                    async with aiohttp.ClientSession() as s, s.get(base + "/-/healthy") as r:
                        if r.status in (200, 401):
                            break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)
            yield base

    return _up


def _from(address: str, limit: int = 100) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(address, 0), limit=limit))


async def _flood(base: str, address: str, loops: int, stop: asyncio.Event, statuses: list[int]) -> None:
    """`loops` clients at `address` sending a wrong password back to back until `stop`."""
    async with _from(address, limit=loops) as session:
        async def one(i: int) -> None:
            while not stop.is_set():
                try:
                    async with session.get(base + "/metrics", headers=_basic("prometheus", f"guess{i}")) as r:
                        statuses.append(r.status)
                        await r.read()
                except aiohttp.ClientError:
                    await asyncio.sleep(0.01)

        await asyncio.gather(*(one(i) for i in range(loops)))


# -- 1. one address floods; another logs in ------------------------------------------------------------------
async def test_a_flood_from_one_address_does_not_lock_out_a_new_login_from_another(served) -> None:  # type: ignore[no-untyped-def]
    """Checks slower than the failure limit's refill (1 s; a cost-13/14 hash on a busy host): a flood that could
    keep every queue slot filled must hold only its own share, and another address's login gets its turn."""
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    async with served({"prometheus": hashed}, check_seconds=1.2) as base:
        stop, statuses = asyncio.Event(), []
        flood = asyncio.create_task(_flood(base, "127.0.0.2", 40, stop, statuses))
        try:
            await asyncio.sleep(3.0)  # the flood has spent its burst and holds whatever queue it can
            answers = []
            async with _from("127.0.0.1") as honest:
                for _ in range(3):
                    start = time.monotonic()
                    async with honest.get(base + "/metrics", headers=_basic("prometheus", PASSWORD),
                                          timeout=aiohttp.ClientTimeout(total=30)) as r:
                        answers.append((r.status, round(time.monotonic() - start, 2)))
                    await asyncio.sleep(0.2)
        finally:
            stop.set()
            await flood
        assert 429 in statuses  # the flood was limited ...
        assert answers[0][0] == 200, answers  # ... and the other address's first login got through
        assert all(status == 200 for status, _ in answers), answers
        assert answers[0][1] < 2 * 4 * 1.2, answers  # its turn within a few checks, not behind the flood's backlog


async def test_a_client_holds_at_most_its_share_of_the_queue() -> None:
    """One client's concurrent checks past its share are refused at once; another client's check is next."""
    auth = webconfig.BasicAuth()
    users = {"prometheus": bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))}
    real = auth._verify
    auth._verify = lambda p, h: time.sleep(0.3) or real(p, h)  # type: ignore[method-assign]
    wrong = "Basic " + base64.b64encode(b"prometheus:wrong").decode()
    flood = [asyncio.create_task(auth.decide(wrong, users, "10.9.0.1")) for _ in range(8)]
    await asyncio.sleep(0.05)
    start = time.monotonic()
    right = "Basic " + base64.b64encode(b"prometheus:pw").decode()
    assert await auth.decide(right, users, "10.9.0.2") == webconfig.OK
    waited = time.monotonic() - start
    statuses = await asyncio.gather(*flood)
    assert statuses.count(webconfig.LIMITED) >= 4, statuses  # most of the 8 refused, without bcrypt
    assert waited < 2 * 3 * 0.3, waited  # the running check, maybe one more of the flood's, then its own


async def test_many_failing_addresses_do_not_refuse_a_first_login_from_one_that_has_not_failed() -> None:
    """40 addresses, each with its share of wrong passwords always under way, fill the queue of checks
    (40 x AUTH_PER_CLIENT > AUTH_QUEUE). A first correct login from an address that has not failed is never
    refused for their backlog (it was 429: the shared queue was full), and waits for the check running and
    its own, not for theirs: 32 queued checks of 0.1 s would be 3.2 s."""
    auth = webconfig.BasicAuth()
    # four users, so that each of the four logins is a first one (a login seen before is remembered)
    users = {f"u{k}": bcrypt.hashpw(f"pw{k}".encode(), bcrypt.gensalt(rounds=4)) for k in range(4)}
    real = auth._verify
    auth._verify = lambda p, h: time.sleep(0.1) or real(p, h)  # type: ignore[method-assign]
    wrong = "Basic " + base64.b64encode(b"u0:wrong").decode()
    stop, failed = asyncio.Event(), collections.Counter()

    async def flood(client: str) -> None:
        while not stop.is_set():
            answer = await auth.decide(wrong, users, client)
            failed[client] += answer == webconfig.DENIED
            if answer == webconfig.LIMITED:
                await asyncio.sleep(0.05)  # a real client is held LIMITED_DELAY

    flooders = [asyncio.create_task(flood(f"10.8.0.{i}")) for i in range(40) for _ in range(webconfig.AUTH_PER_CLIENT)]
    try:
        deadline = time.monotonic() + 60
        # every flooding address has failed, and the checks of theirs sent before that have run: from now on
        # all of theirs are in the second lane (the first seconds, 40 new addresses are as new as any other)
        while len(failed) < 40 or auth._pending[0]:
            assert time.monotonic() < deadline, (len(failed), auth._pending)
            await asyncio.sleep(0.1)
        assert auth._pending[1] >= webconfig.AUTH_QUEUE // 2, auth._pending  # the flood holds a backlog
        answers = []
        for k in range(4):
            start = time.monotonic()
            right = "Basic " + base64.b64encode(f"u{k}:pw{k}".encode()).decode()
            answers.append((await auth.decide(right, users, f"10.9.0.{k}"), time.monotonic() - start))
    finally:
        stop.set()
        await asyncio.gather(*flooders)
    assert [status for status, _ in answers] == [webconfig.OK] * 4, answers
    assert max(waited for _, waited in answers) < 1.5, answers  # 0.2 s quiet; 3.2 s behind the flood's queue


# -- 2. a web config that configures nothing ------------------------------------------------------------------
HEADERS_ONLY = "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"


@pytest.mark.parametrize(("text", "check_only"), [
    ("", True), ("# only a comment\n", True), ("{}\n", True), ("null\n", True), ("basic_auth_users: {}\n", True),
    ("basic_auth_users:\n", True), ("http_server_config: {}\n", True), ("", False), ("basic_auth_users: {}\n", False),
    # headers alone guard nothing: a config of only http_server_config serves as openly as an empty one
    (HEADERS_ONLY, True), (HEADERS_ONLY, False)])
def test_a_web_config_that_configures_nothing_exits_2(tmp_path: Path, text: str, check_only: bool) -> None:
    path = tmp_path / "web.yml"
    path.write_text(text)
    args = [sys.executable, "-m", "rooflight", "run", "--engine-url", "http://127.0.0.1:9", "--no-nvml",
            "--no-process", "--listen", f"0.0.0.0:{free_port()}", "--web-config", str(path)]
    result = subprocess.run(args + (["--check-only"] if check_only else []), capture_output=True, text=True,
                            timeout=30, cwd=ROOT)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "authentication off" in result.stderr and "Traceback" not in result.stderr
    assert "serving" not in result.stdout


# -- 3. a client looping on 429 is slowed down ----------------------------------------------------------------
async def test_a_client_looping_on_429_waits_for_each_answer(served) -> None:  # type: ignore[no-untyped-def]
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    async with served({"prometheus": hashed}) as base:
        stop, statuses = asyncio.Event(), []
        flood = asyncio.create_task(_flood(base, "127.0.0.2", 10, stop, statuses))
        await asyncio.sleep(4.0)
        stop.set()
        await flood
        limited = statuses.count(429)
        # 10 connections for 4 s, one 429 per LIMITED_DELAY each: about 40 (without the delay: thousands).
        assert 0 < limited <= 2 * 10 * 4 / webconfig.LIMITED_DELAY, (limited, len(statuses))


# -- 4. the same cost whatever the user ------------------------------------------------------------------------
async def test_a_wrong_password_costs_the_same_for_cheap_and_dear_users(served) -> None:  # type: ignore[no-untyped-def]
    """Each user's cost is the fastest of 15 checks: a busy machine only ever adds time to a check, so the
    minimum is the check's own cost, where a median of a few moves with whatever else runs (a ratio of 4.28
    was read from medians of 5 on two busy cores)."""
    cheap = bcrypt.hashpw(b"pw-cheap", bcrypt.gensalt(rounds=4)).decode()
    dear = bcrypt.hashpw(b"pw-dear", bcrypt.gensalt(rounds=10)).decode()
    async with served({"cheap": cheap, "dear": dear}) as base:
        # three addresses a user, 5 wrong passwords each: under FAIL_BURST, so each is a real check
        users = {"dear": ("127.0.0.3", "127.0.0.13", "127.0.0.23"), "cheap": ("127.0.0.4", "127.0.0.14", "127.0.0.24"),
                 "nobody": ("127.0.0.5", "127.0.0.15", "127.0.0.25")}
        times: dict[str, list[float]] = {user: [] for user in users}
        sessions = {(user, a): _from(a) for user, addresses in users.items() for a in addresses}
        opened = {key: await cm.__aenter__() for key, cm in sessions.items()}
        try:
            for i in range(5):  # the users interleaved, so load hits all
                for (user, _), session in opened.items():
                    start = time.perf_counter()
                    async with session.get(base + "/metrics", headers=_basic(user, f"wrong{i}")) as r:
                        assert r.status == 401
                    times[user].append(time.perf_counter() - start)
        finally:
            for cm in sessions.values():
                await cm.__aexit__(None, None, None)
        assert all(len(t) == 15 for t in times.values())
        dear_s, cheap_s, nobody_s = (min(times[u]) for u in ("dear", "cheap", "nobody"))
        # cost 4 alone is 64x cheaper than cost 10 (a ratio of 0.016); topped up, the three agree: within 4x
        # either way on a loaded machine, 16x away from what the leak reads
        assert 0.25 < cheap_s / dear_s < 4, (cheap_s, dear_s)
        assert 0.25 < nobody_s / dear_s < 4, (nobody_s, dear_s)
        async with _from("127.0.0.6") as session:  # the right passwords still work for both
            for user, pw in (("cheap", "pw-cheap"), ("dear", "pw-dear")):
                async with session.get(base + "/-/healthy", headers=_basic(user, pw)) as r:
                    assert r.status == 200


def test_top_ups_add_up_to_the_top_cost() -> None:
    for cost in range(webconfig.MIN_COST, webconfig.MAX_COST + 1):
        for top in range(cost, webconfig.MAX_COST + 1):
            assert 2 ** cost + sum(2 ** c for c in webconfig.top_up_costs(cost, top)) == 2 ** top
