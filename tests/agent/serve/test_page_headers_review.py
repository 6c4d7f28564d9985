"""The agent's answers to hostile names, over real HTTP on 127.0.0.1.

A target or model name holding control characters must not make the roofline SVG ill-formed (a browser
then draws nothing), and every answer carries Content-Security-Policy, X-Content-Type-Options and
X-Frame-Options; the status page's policy allows its own inline script and styles by hash only.
(tests/e2e/test_status_page_browser.py checks in Chromium that the page still draws under it.)
"""

from __future__ import annotations

import dataclasses

import asyncio
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import bcrypt
import pytest

from rooflight.agent.config.agent import build
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.serve import webconfig
from rooflight.agent.serve.roofline_svg import render_roofline
from support import free_port, serve_task

EVIL = "ev\x01il\x08\x0b\x0c\x1b[31m\x7f\x85\x9b2J\ufffe"


async def _up(port: int) -> None:
    for _ in range(200):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)


@pytest.fixture
async def evil_target() -> AsyncIterator[str]:
    config = build({"targets": [{"url": "http://127.0.0.1:9", "name": "plain"}]}, {},
                   {"nvml": False, "process": False, "interval": "1", "windows": "10s", "scrape_timeout": "0.3"})
    # The config refuses such a name at start now (tests/agent/config/test_config_errors.py); the page must
    # still escape whatever reaches it, so the name is set past the check.
    config = dataclasses.replace(config, targets=(dataclasses.replace(config.targets[0], name=EVIL),))
    port = free_port()
    async with serve_task(Agent(config), port):
        await _up(port)
        yield f"http://127.0.0.1:{port}"


async def test_control_characters_in_a_name_leave_the_svg_well_formed(evil_target: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(evil_target + "/roofline.svg") as r:
            assert r.status == 200
            text = await r.text()
    root = ET.fromstring(text)  # raises on a character XML forbids
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert "ev" in text and "\x1b" not in text and "\x01" not in text


def test_control_characters_in_model_labels_leave_the_svg_well_formed() -> None:
    roof = {"gpu_profile": "h100-sxm", "gpu_name": "H100 SXM", "tensor_parallel_size": 1, "compute_dtype": "bf16",
            "peak_flops": 989e12, "peak_bandwidth": 3.35e12, "ridge": 989e12 / 3.35e12}
    series = [{"model": EVIL + str(i), "rank": "0", "operating": {"decode": {"intensity": 30.0 + i, "flops": 5e13},
                                                                  "prefill": {"intensity": 600.0, "flops": 4e14}},
               "ceilings": [{"kind": "ceiling", "batch": 8, "intensity": 40.0, "flops": 1e14,
                             "tokens_per_second": 900.0, "step_seconds": 0.01}]} for i in range(2)]
    text = render_roofline({"name": EVIL, "roofline": roof, "series": series})
    root = ET.fromstring(text)
    labels = [g.get("data-series") for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("data-series")]
    assert len(labels) >= 2 and all(label.startswith("ev") for label in labels)


PATHS = ["/", "/metrics", "/-/healthy", "/-/ready", "/api/v1/status", "/api/v1/snapshot", "/roofline.svg",
         "/no-such-page"]


def _assert_security_headers(headers: "aiohttp.typedefs.LooseHeaders", what: str) -> None:
    assert headers.get("X-Content-Type-Options") == "nosniff", what
    assert headers.get("X-Frame-Options") == "DENY", what
    csp = headers.get("Content-Security-Policy", "")
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, (what, csp)
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp, (what, csp)


async def test_every_answer_carries_the_security_headers(evil_target: str) -> None:
    async with aiohttp.ClientSession() as s:
        for path in PATHS:
            async with s.get(evil_target + path) as r:
                _assert_security_headers(r.headers, path)
                if path == "/":
                    csp = r.headers["Content-Security-Policy"]
                    assert re.search(r"script-src 'sha256-[A-Za-z0-9+/=]+'", csp), csp
                    assert "connect-src 'self'" in csp
    port = int(evil_target.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)  # a malformed request: the server's 400
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head = raw.split(b"\r\n\r\n", 1)[0].decode()
    assert re.match(r"HTTP/1\.[01] 400 ", head), head
    fields = dict(line.split(": ", 1) for line in head.split("\r\n")[1:])
    _assert_security_headers(fields, "400")


async def test_refusals_of_auth_carry_them_too(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  p: '{bcrypt.hashpw(b'pw', bcrypt.gensalt(rounds=4)).decode()}'\n")
    port = free_port()
    config = build({}, {}, {"engine_url": ["http://127.0.0.1:9"], "nvml": False, "process": False})
    async with serve_task(Agent(config), port, security=webconfig.WebSecurity(path)):
        await _up(port)
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
            assert r.status == 401
            _assert_security_headers(r.headers, "401")
