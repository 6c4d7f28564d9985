"""The agent's endpoints behind an exporter-toolkit web config: basic auth (bcrypt), TLS, mutual TLS,
reload, request limits, no URL from a request, no secrets in logs or pages. Real HTTP(S) on 127.0.0.1.

The last tests run the real `rooflight run` with a web config.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import signal
import ssl
import subprocess
import sys
from pathlib import Path
from contextlib import asynccontextmanager
from typing import AsyncIterator

import aiohttp
import bcrypt
import pytest
from aiohttp import web

from rooflight.agent.serve import webconfig
from rooflight.agent.config.settings import DEFAULT_LISTEN
from rooflight.agent.config.agent import AgentConfig, build
from rooflight.agent.errors import ConfigError
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.serve.server import build_app
from support import ROOT, FakeEngine, free_port, started_agent

PASSWORD = "correct horse battery staple"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()  # cheap rounds: tests, not storage


def _basic(user: str, password: str) -> dict[str, str]:
    import base64

    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


# -- certificates -------------------------------------------------------------------------------
def _certs(tmp: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all PEM files under tmp."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    import ipaddress

    now = datetime.datetime.now(datetime.timezone.utc)

    def make(name: str, issuer: tuple | None, *, ca: bool = False, server: bool = False):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = (
            x509.CertificateBuilder().subject_name(subject)
            .issuer_name(issuer[0].subject if issuer else subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
            ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        elif not ca:
            builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        cert = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
        (tmp / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (tmp / f"{name}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        return cert, key

    ca = make("ca", None, ca=True)
    make("server", ca, server=True)
    make("client", ca)
    return {n: tmp / n for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _certs(tmp_path_factory.mktemp("certs"))


# -- serving --------------------------------------------------------------------------------------
def _config(url: str = "http://127.0.0.1:9") -> AgentConfig:
    return build({}, {}, {"engine_url": [url], "nvml": False, "process": False, "interval": "0.1",
                          "windows": "1s,2s", "scrape_timeout": "0.3"})


@asynccontextmanager
async def _served(security: webconfig.WebSecurity, config: AgentConfig | None = None) -> AsyncIterator[tuple[Agent, str]]:
    """An agent (no loops) behind `security` on 127.0.0.1: (agent, base URL); server and agent always stop."""
    async with started_agent(config or _config(), loops=False) as agent:
        runner = web.AppRunner(build_app(agent, manage_agent=False, middlewares=[security.middleware]),
                               shutdown_timeout=0.1)
        await runner.setup()
        try:
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port, ssl_context=security.ssl_context).start()
            scheme = "https" if security.ssl_context else "http"
            yield agent, f"{scheme}://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
async def auth_server(tmp_path: Path) -> AsyncIterator[tuple[str, webconfig.WebSecurity]]:
    security = webconfig.WebSecurity(_write(tmp_path / "web.yml", f"basic_auth_users:\n  prometheus: '{HASH}'\n"))
    async with _served(security) as (_, base):
        yield base, security


# -- validation -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("basic_auth_users: [", "not valid YAML"),
        ("basic_auth_user:\n  a: b\n", "unknown key 'basic_auth_user'"),
        ("basic_auth_users:\n  alice: hunter2\n", "not a bcrypt hash"),
        ("tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n", "not a readable file"),
        ("tls_server_config:\n  cert_file: x\n", "needs both cert_file and key_file"),
        ("tls_server_config:\n  cert_file: x\n  key_file: y\n  client_allowed_sans: [a]\n", "client_allowed_sans: not supported"),
        ("tls_server_config:\n  cert_file: x\n  key_file: y\n  client_auth_type: RequireAnyClientCert\n", "not supported"),
        ("http_server_config:\n  headers:\n    Authorization: x\n", "set by the agent"),
        ("- a\n- b\n", "top level must be a mapping"),
    ],
)
def test_bad_web_config_says_what_to_fix(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("[", r"\[")):
        webconfig.load(_write(tmp_path / "web.yml", text))


def test_bad_tls_settings_are_refused(tmp_path: Path, certs: dict[str, Path]) -> None:
    base = f"tls_server_config:\n  cert_file: {certs['server.crt']}\n  key_file: {certs['server.key']}\n"
    for extra, says in [
        (f"  client_ca_file: {certs['ca.crt']}\n", "NoClientCert"),
        ("  client_auth_type: RequireAndVerifyClientCert\n", "needs client_ca_file"),
        ("  min_version: TLS99\n", "min_version"),
    ]:
        with pytest.raises(ConfigError, match=says):
            webconfig.load(_write(tmp_path / "web.yml", base + extra))
    # a key that does not belong to the certificate is caught at load, not at the first handshake
    mismatched = f"tls_server_config:\n  cert_file: {certs['server.crt']}\n  key_file: {certs['client.key']}\n"
    with pytest.raises(ConfigError, match="cannot load"):
        webconfig.load(_write(tmp_path / "web.yml", mismatched))


def test_relative_paths_resolve_next_to_the_file(tmp_path: Path, certs: dict[str, Path]) -> None:
    folder = certs["ca.crt"].parent
    config = webconfig.load(_write(folder / "web.yml", "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"))
    assert config.tls is not None and config.tls.cert_file == folder / "server.crt"
    assert config.tls.min_version == ssl.TLSVersion.TLSv1_2


def test_default_listen_address_is_loopback() -> None:
    assert DEFAULT_LISTEN.startswith("127.0.0.1:")
    assert build({}, {}, {"engine_url": ["http://127.0.0.1:8000"]}).listen_host == "127.0.0.1"


# -- basic auth -------------------------------------------------------------------------------------
async def test_basic_auth_refuses_wrong_and_missing_credentials(auth_server: tuple) -> None:
    base, _ = auth_server
    async with aiohttp.ClientSession() as s:
        for path in ("/metrics", "/", "/api/v1/snapshot", "/-/ready", "/-/healthy"):
            async with s.get(base + path) as r:
                assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Basic")
        for user, password in [("prometheus", "wrong"), ("nobody", PASSWORD), ("prometheus", ""), ("", "")]:
            async with s.get(base + "/metrics", headers=_basic(user, password)) as r:
                assert r.status == 401, (user, password)
        async with s.get(base + "/metrics", headers={"Authorization": "Basic !!notbase64"}) as r:
            assert r.status == 401
        async with s.get(base + "/metrics", headers=_basic("prometheus", PASSWORD)) as r:
            assert r.status == 200 and "rooflight_source_up" in await r.text()


async def test_a_good_password_is_checked_once_then_cached(auth_server: tuple) -> None:
    base, security = auth_server
    calls = []
    real = security.auth._verify
    security.auth._verify = lambda p, h: calls.append(1) or real(p, h)  # type: ignore[method-assign]
    async with aiohttp.ClientSession(headers=_basic("prometheus", PASSWORD)) as s:
        for _ in range(20):
            async with s.get(base + "/metrics") as r:
                assert r.status == 200
    assert len(calls) == 1
    async with aiohttp.ClientSession(headers=_basic("prometheus", "nope")) as s:
        for _ in range(3):
            async with s.get(base + "/metrics") as r:
                assert r.status == 401
    assert len(calls) == 4  # failures are never cached


async def test_reload_on_change_and_on_sighup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(webconfig, "RELOAD_CHECK_SECONDS", 0.0)
    path = _write(tmp_path / "web.yml", f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    security = webconfig.WebSecurity(path)
    async with _served(security) as (agent, base):
        other = bcrypt.hashpw(b"second", bcrypt.gensalt(rounds=4)).decode()
        try:
            async with aiohttp.ClientSession() as s:
                async def status(user: str, password: str) -> int:
                    async with s.get(base + "/metrics", headers=_basic(user, password)) as r:
                        return r.status

                assert await status("prometheus", PASSWORD) == 200
                _write(path, f"basic_auth_users:\n  scraper: '{other}'\n")
                os.utime(path, ns=(1, 1))  # a new mtime, whatever the file system's resolution
                assert await status("prometheus", PASSWORD) == 401  # the cached success went with its user
                assert await status("scraper", "second") == 200
                # a broken file keeps the last good config, and says why without echoing the file
                _write(path, "basic_auth_users:\n  scraper: plaintext-password\n")
                os.utime(path, ns=(2, 2))
                with caplog.at_level(logging.ERROR, logger="rooflight"):
                    assert await status("scraper", "second") == 200
                assert "not reloaded" in caplog.text and "plaintext-password" not in caplog.text
                # SIGHUP reloads without waiting for the mtime check
                monkeypatch.setattr(webconfig, "RELOAD_CHECK_SECONDS", 3600.0)
                _write(path, f"basic_auth_users:\n  prometheus: '{HASH}'\n")
                security.install_sighup(asyncio.get_running_loop())
                os.kill(os.getpid(), signal.SIGHUP)
                await asyncio.sleep(0.05)
                assert await status("prometheus", PASSWORD) == 200
                assert await status("scraper", "second") == 401
        finally:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)


# -- TLS ----------------------------------------------------------------------------------------------
def _client_ctx(certs: dict[str, Path], *, with_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs["ca.crt"]))
    if with_cert:
        ctx.load_cert_chain(str(certs["client.crt"]), str(certs["client.key"]))
    return ctx


async def test_tls_required_plain_http_gets_nothing(tmp_path: Path, certs: dict[str, Path]) -> None:
    text = (f"tls_server_config:\n  cert_file: {certs['server.crt']}\n  key_file: {certs['server.key']}\n"
            f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    async with _served(webconfig.WebSecurity(_write(tmp_path / "web.yml", text))) as (agent, base):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s:
            with pytest.raises(aiohttp.ClientError):
                async with s.get(base.replace("https", "http") + "/metrics",
                                 headers=_basic("prometheus", PASSWORD)) as r:
                    await r.read()
            async with s.get(base + "/metrics", ssl=_client_ctx(certs)) as r:
                assert r.status == 401  # TLS alone does not let anyone in
            async with s.get(base + "/metrics", ssl=_client_ctx(certs),
                             headers=_basic("prometheus", PASSWORD)) as r:
                assert r.status == 200
            old = ssl.create_default_context(cafile=str(certs["ca.crt"]))
            old.maximum_version = ssl.TLSVersion.TLSv1_1
            old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
            with pytest.raises(aiohttp.ClientError):  # below min_version (TLS12 by default)
                async with s.get(base + "/metrics", ssl=old) as r:
                    await r.read()


async def test_mutual_tls_refuses_a_client_without_a_certificate(tmp_path: Path, certs: dict[str, Path]) -> None:
    text = (f"tls_server_config:\n  cert_file: {certs['server.crt']}\n  key_file: {certs['server.key']}\n"
            f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {certs['ca.crt']}\n"
            "http_server_config:\n  headers:\n    Strict-Transport-Security: max-age=31536000\n")
    async with _served(webconfig.WebSecurity(_write(tmp_path / "web.yml", text))) as (agent, base):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s:
            with pytest.raises(aiohttp.ClientError):
                async with s.get(base + "/metrics", ssl=_client_ctx(certs)) as r:
                    await r.read()
            async with s.get(base + "/metrics", ssl=_client_ctx(certs, with_cert=True)) as r:
                assert r.status == 200
                assert r.headers["Strict-Transport-Security"] == "max-age=31536000"


# -- what a request can and cannot do -------------------------------------------------------------------
async def test_no_request_makes_the_agent_fetch_a_url(fake_engine: FakeEngine) -> None:
    canary = FakeEngine(body="canary 1\n")
    await canary.start()
    security = webconfig.WebSecurity.__new__(webconfig.WebSecurity)  # no file: an open endpoint
    security.config, security.ssl_context = webconfig.WebConfig(), None
    security.maybe_reload = lambda: None  # type: ignore[method-assign]
    async with _served(security, _config(fake_engine.url)) as (agent, base):
        try:
            async with aiohttp.ClientSession() as s:
                for path in (f"/metrics?target={canary.url}", f"/api/v1/snapshot?url={canary.url}/metrics",
                             f"/probe?target={canary.url}", f"/?target={canary.url}", f"/metrics?module={canary.url}"):
                    async with s.get(base + path) as r:
                        await r.read()
                big = "x" * 20_000
                async with s.get(base + "/metrics", headers={"X-Big": big}) as r:
                    assert r.status in (400, 431)  # aiohttp's header limit (max_field_size)
                many = {f"X-H{i}": "1" for i in range(200)}
                async with s.get(base + "/metrics", headers=many) as r:
                    assert r.status in (400, 431)
                async with s.post(base + "/metrics", data=b"x" * 200_000) as r:
                    assert r.status in (405, 413)
                async with s.get(base + "/-/healthy") as r:
                    assert r.status == 200  # still serving after the abuse
            assert canary.requests == 0
        finally:
            await canary.stop()


async def test_credentials_in_an_engine_url_stay_out_of_logs_labels_and_pages(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The target's name and every message drop the URL's userinfo."""
    url = f"http://scraper:s3cr3t-token@127.0.0.1:{free_port()}"
    security = webconfig.WebSecurity.__new__(webconfig.WebSecurity)
    security.config, security.ssl_context = webconfig.WebConfig(), None
    security.maybe_reload = lambda: None  # type: ignore[method-assign]
    async with _served(security, _config(url)) as (agent, base):
        with caplog.at_level(logging.DEBUG):
            await agent.sample_engines_once()  # refused: the failure is logged
        assert agent.snapshot.health[0].up is False
        async with aiohttp.ClientSession() as s:
            pages = []
            for path in ("/metrics", "/", "/api/v1/snapshot"):
                async with s.get(base + path) as r:
                    pages.append(await r.text())
        for text in (caplog.text, *pages, str(agent.snapshot.health[0].message)):
            assert "s3cr3t-token" not in text
        assert "127.0.0.1" in pages[0]
        # the JSON and the landing page show nothing /metrics does not: no URL, no error message
        for text in pages[1:]:
            assert url not in text and "cannot connect" not in text


# -- the real command ------------------------------------------------------------------------------------
def _rooflight(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rooflight", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("check_only", [True, False])
def test_cli_bad_web_config_exits_2_with_a_clear_error(tmp_path: Path, check_only: bool) -> None:
    bad = _write(tmp_path / "web.yml", "basic_auth_users:\n  alice: hunter2\n")
    args = ["run", "--engine-url", "http://127.0.0.1:9", "--no-nvml", "--no-process",
            "--listen", f"127.0.0.1:{free_port()}", "--web-config", str(bad)]
    result = _rooflight(*args, *(["--check-only"] if check_only else []))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "not a bcrypt hash" in result.stderr and "hunter2" not in result.stderr


async def test_cli_serves_tls_and_basic_auth(tmp_path: Path, certs: dict[str, Path]) -> None:
    web_yml = _write(tmp_path / "web.yml",
                     f"tls_server_config:\n  cert_file: {certs['server.crt']}\n  key_file: {certs['server.key']}\n"
                     f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rooflight", "run", "--engine-url", "http://127.0.0.1:9", "--no-nvml", "--no-process",
        "--listen", f"127.0.0.1:{port}", "--web-config", str(web_yml), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        async def serving_line() -> str:
            while True:  # log lines (the engine at :9 refuses) come before or after it
                line = (await proc.stdout.readline()).decode()  # type: ignore[union-attr]
                if "serving" in line or not line:
                    return line

        assert f"https://127.0.0.1:{port}/metrics" in await asyncio.wait_for(serving_line(), 20)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
            url = f"https://127.0.0.1:{port}/metrics"
            async with s.get(url, ssl=_client_ctx(certs)) as r:
                assert r.status == 401
            async with s.get(url, ssl=_client_ctx(certs), headers=_basic("prometheus", PASSWORD)) as r:
                assert r.status == 200
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)
