"""The proxy's own thread (agent/proxy/thread.py): an error that ends a serving proxy is logged, not
swallowed (nothing else checks it). A real ProxyServer on 127.0.0.1 relaying
to the fake upstream; its stop is made to fail after doing its real work."""

from __future__ import annotations

import logging
import socket

import aiohttp
import pytest

from fake_upstream import FakeUpstream
from ports import free_port
from rooflight.agent.proxy.config import build
from rooflight.agent.proxy.server import ProxyServer
from rooflight.agent.proxy.thread import ProxyThread
from test_proxy_hardening import upstream  # noqa: F401 (fixture)


async def test_an_error_that_ends_a_serving_proxy_is_logged(upstream: FakeUpstream,  # noqa: F811
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    config = build(upstream.url, listen="127.0.0.1:0", metrics_listen="127.0.0.1:0")
    server = ProxyServer(config)
    real_stop = server.stop

    async def stop_then_fail() -> None:
        await real_stop()
        raise OSError("the disk went away")

    monkeypatch.setattr(server, "stop", stop_then_fail)
    thread = ProxyThread(server)
    await thread.start(refresh_loop=False)
    async with aiohttp.ClientSession() as client, client.get(server.proxy_url + "/echo") as r:
        assert r.status == 200  # it serves, on its own thread
    with caplog.at_level(logging.ERROR, logger="rooflight.proxy"):
        await thread.stop()
    assert any(rec.levelno == logging.ERROR and "the proxy stopped: OSError: the disk went away" in rec.getMessage()
               for rec in caplog.records)


async def test_a_start_that_fails_releases_the_port_it_had_bound(upstream: FakeUpstream) -> None:  # noqa: F811
    # The relay's port binds first; the /metrics port is taken, so the start fails with OSError and must give
    # the relay's port back (a retry, or whatever runs next, can bind it at once).
    relay = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = build(upstream.url, listen=f"127.0.0.1:{relay}",
                       metrics_listen=f"127.0.0.1:{taken.getsockname()[1]}")
        thread = ProxyThread(ProxyServer(config))
        with pytest.raises(OSError):
            await thread.start(refresh_loop=False)
    with socket.socket() as again:
        again.bind(("127.0.0.1", relay))  # raises EADDRINUSE while the failed proxy still holds it
