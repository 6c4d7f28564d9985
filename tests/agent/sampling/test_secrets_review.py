"""Secrets stay out of config errors and log lines.

An engine URL may carry user:password, `?token=...` and a `#fragment`; none of them may reach a log line
or a config error. A config of the wrong shape (a setting name that is not text) is a ConfigError, never
a TypeError. The fetch runs over real sockets against an engine on 127.0.0.1 that answers 500 or hangs.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from rooflight.agent.errors import ConfigError
from rooflight.agent.config.agent import build
from rooflight.collectors.errors import SourceError
from rooflight.collectors.http import fetch_text
from support import free_port


@pytest.mark.parametrize("entry", [{"uri": "http://admin:hunter2@10.0.0.1:8000"},
                                   {"name": "a", "URL": "http://10.0.0.1:8000/?token=hunter2"},
                                   "http://admin:hunter2@10.0.0.1:8000"])
def test_a_targets_entry_without_url_does_not_echo_its_values(entry: object) -> None:
    with pytest.raises(ConfigError) as caught:
        build({"targets": [entry]}, {}, {})
    assert "hunter2" not in str(caught.value)
    assert "url" in str(caught.value)


@pytest.mark.parametrize("settings", [{1: 2, "interval": "1s"}, {None: 1}, {(1, 2): 3, "bogus": 1},
                                      {"targets": [{"url": "http://127.0.0.1:1", 7: 1}]}])
def test_setting_names_that_are_not_text_are_a_config_error(settings: dict) -> None:
    with pytest.raises(ConfigError, match="setting name|unknown key"):
        build(settings, {}, {"engine_url": ["http://127.0.0.1:1"]})


async def _engine(handler) -> tuple[web.AppRunner, int]:  # type: ignore[no-untyped-def]
    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


@pytest.mark.parametrize("answer", ["500", "hang", "refused", "garbage"])
async def test_a_token_or_fragment_in_an_engine_url_never_reaches_an_error(answer: str,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        if answer == "hang":
            await asyncio.sleep(5)
        if answer == "garbage":  # a broken response: aiohttp's error text carries the URL
            request.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nzz")
            request.transport.close()
            await asyncio.sleep(1)
        return web.Response(status=500)

    runner, port = await _engine(handler)
    if answer == "refused":
        await runner.cleanup()
    url = f"http://user:pa55word@127.0.0.1:{port}/metrics?token=t0ken-secret&x=1#frag-secret"
    try:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(SourceError) as caught:
                await fetch_text(session, url, timeout=0.5, max_bytes=1 << 20,
                                 monotonic=asyncio.get_running_loop().time)
    finally:
        await runner.cleanup()
    message = str(caught.value) + str(getattr(caught.value, "message", ""))
    for secret in ("pa55word", "t0ken-secret", "frag-secret", "token="):
        assert secret not in message, message
    assert f"127.0.0.1:{port}" in message
