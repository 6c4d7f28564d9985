"""An authenticated gzip scrape of /metrics while many clients hammer the agent with bad passwords.

The agent runs as the real `rooflight run` in its own process, behind a web config with one bcrypt
user (cost 12 by default, as `htpasswd -nBC 12` makes), watching an engine that serves a recorded vLLM
page (so /metrics is well over aiohttp's 4 KiB gzip-in-a-thread threshold). This process runs N
clients that send a wrong password back to back, and one scraper that sends the right one with
`Accept-Encoding: gzip`, as Prometheus does, for a bounded time; over HTTP, then over TLS.

Reports, per mode: the scraper's p50/p99/max latency (and, measured first on the same agent for half as
long, its p50/p99 with no flood: the baseline, and the flood's p99 over it), the bad clients' requests per second and the
statuses they got (401 after a bcrypt check, 429 once their IP is over the failure limit).

    python bench/auth_flood.py --bad-clients 40 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import ipaddress
import json
import os
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import bcrypt
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "fixtures" / "engine-samples" / "vllm-cpu-load-c16.prom"
PASSWORD = "correct horse battery staple"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def make_certs(folder: Path) -> tuple[Path, Path]:
    """A self-signed server certificate for 127.0.0.1 (cert, key) under folder."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    (folder / "server.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "server.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return folder / "server.crt", folder / "server.key"


async def _engine() -> tuple[web.AppRunner, str]:
    body = SAMPLE.read_text()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site.port}"


async def _start_agent(engine_url: str, web_yml: Path) -> tuple[asyncio.subprocess.Process, str]:
    """`rooflight run` on a free port; returns the process and its /metrics URL once it serves."""
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rooflight", "run", "--engine-url", engine_url, "--no-nvml", "--no-process",
        "--model", "llama-3-8b", "--gpu", "h100-sxm", "--listen", f"127.0.0.1:{port}", "--web-config", str(web_yml),
        "--log-level", "error", cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        if not line:
            break
        if "serving" in line:
            asyncio.get_running_loop().create_task(_drain(proc.stdout))
            return proc, line.split("serving ", 1)[1].strip()
    proc.kill()
    raise RuntimeError("the agent did not start serving")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


async def _bad_client(url: str, ssl_ctx: ssl.SSLContext | bool, n: int, stop: float,
                      statuses: dict[int, int]) -> None:
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, headers=_basic("prometheus", f"guess-{n}")) as s:
        while time.monotonic() < stop:
            try:
                async with s.get(url, ssl=ssl_ctx) as r:
                    await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1
            except aiohttp.ClientError:
                statuses[0] = statuses.get(0, 0) + 1


async def _flood(url: str, ssl_ctx: ssl.SSLContext | bool, bad_clients: int, seconds: float,
                 every: float) -> dict[str, Any]:
    headers = {**_basic("prometheus", PASSWORD), "Accept-Encoding": "gzip"}
    statuses: dict[int, int] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60), headers=headers,
                                     auto_decompress=True) as good:
        async with good.get(url, ssl=ssl_ctx) as r:  # Prometheus was scraping before the flood began
            assert r.status == 200, r.status
            assert r.headers.get("Content-Encoding") == "gzip", "the scrape was not gzipped"
            size = len(await r.read())
        quiet = await _scrapes(good, url, ssl_ctx, time.monotonic() + seconds / 2, every)  # the baseline, no flood
        stop = time.monotonic() + seconds
        tasks = [asyncio.create_task(_bad_client(url, ssl_ctx, n, stop, statuses)) for n in range(bad_clients)]
        await asyncio.sleep(min(1.0, seconds / 4))  # let the flood build up first
        latencies = await _scrapes(good, url, ssl_ctx, stop, every)
        await asyncio.gather(*tasks)
    bad = sum(statuses.values())
    return {
        "scrapes": len(latencies),
        "metrics_bytes": size,
        "scrape_p50_ms": round(1000 * percentile(latencies, 50), 1),
        "scrape_p99_ms": round(1000 * percentile(latencies, 99), 1),
        "scrape_max_ms": round(1000 * max(latencies), 1) if latencies else float("nan"),
        "no_flood_p50_ms": round(1000 * percentile(quiet, 50), 1),
        "no_flood_p99_ms": round(1000 * percentile(quiet, 99), 1),
        "p99_over_no_flood": round(percentile(latencies, 99) / percentile(quiet, 99), 2) if quiet else float("nan"),
        "bad_requests_per_s": round(bad / seconds, 1),
        "bad_statuses": {str(k): v for k, v in sorted(statuses.items())},
    }


async def _scrapes(good: aiohttp.ClientSession, url: str, ssl_ctx: ssl.SSLContext | bool, stop: float,
                   every: float) -> list[float]:
    """Authenticated gzip scrapes every `every` s until `stop`: their latencies."""
    latencies = []
    while time.monotonic() < stop:
        start = time.monotonic()
        async with good.get(url, ssl=ssl_ctx) as r:
            await r.read()
            assert r.status == 200, f"the authenticated scrape got {r.status}"
        latencies.append(time.monotonic() - start)
        await asyncio.sleep(every)
    return latencies


async def run(bad_clients: int = 40, seconds: float = 10.0, cost: int = 12, modes: tuple[str, ...] = ("http", "tls"),
              every: float = 0.05) -> dict[str, dict[str, Any]]:
    """Run the flood once per mode against a fresh agent; the figures per mode."""
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=cost)).decode()
    engine, engine_url = await _engine()
    out: dict[str, dict[str, Any]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            for mode in modes:
                text = f"basic_auth_users:\n  prometheus: '{hashed}'\n"
                ssl_ctx: ssl.SSLContext | bool = False
                if mode == "tls":
                    cert, key = make_certs(folder)
                    text += f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
                    ssl_ctx = ssl.create_default_context(cafile=str(cert))
                web_yml = folder / f"web-{mode}.yml"
                web_yml.write_text(text)
                proc, url = await _start_agent(engine_url, web_yml)
                try:
                    out[mode] = await _flood(url, ssl_ctx, bad_clients, seconds, every)
                finally:
                    proc.terminate()
                    await proc.wait()
    finally:
        await engine.cleanup()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bad-clients", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--cost", type=int, default=12, help="bcrypt cost of the configured user's hash")
    parser.add_argument("--modes", default="http,tls", help="http, tls or both (comma-separated)")
    args = parser.parse_args()
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    result = asyncio.run(run(args.bad_clients, args.seconds, args.cost, modes))
    print(json.dumps({"bad_clients": args.bad_clients, "seconds": args.seconds, "cost": args.cost,
                      "cpus": os.cpu_count(), **result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
