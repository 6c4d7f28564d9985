"""The proxy against hostile and careless peers (issue 29's review), over real sockets on 127.0.0.1:
credentials in --upstream, bad requests, the accounting's memory budget, and connections that hold the
port (slow headers, idle sockets, one client taking every connection)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
from typing import AsyncIterator

import aiohttp
import pytest

from fake_upstream import FakeUpstream
from rooflight.agent.errors import ConfigError
from rooflight.agent.proxy.config import build
from rooflight.agent.proxy.server import ProxyServer


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    up = FakeUpstream()
    await up.start()
    yield up
    await up.stop()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


async def start_proxy(upstream_url: str, replace: dict[str, object] | None = None, **flags: object) -> ProxyServer:
    config = build(upstream_url, listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", **flags)  # type: ignore[arg-type]
    server = ProxyServer(dataclasses.replace(config, **(replace or {})))  # type: ignore[arg-type]
    await server.start(refresh_loop=False)
    return server


def with_credentials(url: str, user: str = "svc", password: str = "s3cret") -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{user}:{password}@{rest}"


async def echo(client: aiohttp.ClientSession, server: ProxyServer, headers: dict[str, str]) -> tuple[int, list[str]]:
    """The status and the Authorization headers the upstream saw for one request."""
    async with client.post(server.proxy_url + "/echo", data=b"{}", headers=headers) as r:
        if r.status != 200:
            return r.status, []
        seen = await r.json()
    return r.status, [v for k, v in seen["headers"] if k.lower() == "authorization"]


# -- 7. credentials in --upstream ------------------------------------------------------------------------------


def test_credentials_in_the_upstream_are_refused_unless_lent_on_purpose(upstream: FakeUpstream) -> None:
    with pytest.raises(ConfigError, match="--upstream-credentials-for-anonymous") as info:
        build(with_credentials(upstream.url))
    assert "s3cret" not in str(info.value)
    with pytest.raises(ConfigError, match="percent-encode") as info:  # '/' would end the authority early
        build("http://svc:s3/cret@127.0.0.1:8000", upstream_credentials_for_anonymous=True)
    assert "s3" not in str(info.value).replace("--upstream", "")


async def test_lent_credentials_go_to_anonymous_requests_only(upstream: FakeUpstream,
                                                              client: aiohttp.ClientSession) -> None:
    server = await start_proxy(with_credentials(upstream.url, "svc", "p%40ss"), upstream_credentials_for_anonymous=True)
    try:
        lent = "Basic " + base64.b64encode(b"svc:p@ss").decode()
        assert await echo(client, server, {}) == (200, [lent])
        # A client with its own credentials is relayed with its own, never the proxy's, and never refused.
        assert await echo(client, server, {"Authorization": "Bearer sk-client"}) == (200, ["Bearer sk-client"])
        assert await echo(client, server, {"Authorization": "Basic Zm9vOmJhcg=="}) == (200, ["Basic Zm9vOmJhcg=="])
        assert "s3cret" not in repr(server.config) and "p%40ss" not in server.config.upstream
    finally:
        await server.stop()


async def test_a_bearer_token_is_relayed_by_a_proxy_without_credentials(upstream: FakeUpstream,
                                                                       client: aiohttp.ClientSession) -> None:
    server = await start_proxy(upstream.url)
    try:
        assert await echo(client, server, {"Authorization": "Bearer sk-client"}) == (200, ["Bearer sk-client"])
        assert await echo(client, server, {}) == (200, [])  # the proxy adds no Authorization of its own
    finally:
        await server.stop()
