"""TLS and basic auth for the agent's own endpoints, from a Prometheus exporter-toolkit web config file.

The same `web-config.yml` that node_exporter, dcgm-exporter and Prometheus itself read
(prometheus/exporter-toolkit docs/web-configuration.md), so one Helm value or Secret serves them all:

    tls_server_config:
      cert_file: server.crt            # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # or NoClientCert (default), VerifyClientCertIfGiven
      client_ca_file: clients-ca.crt
      min_version: TLS12               # TLS10..TLS13; default TLS12
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2b$12$...           # bcrypt hashes only, never a password

What this module owns: parsing and validating that file (ConfigError says what to fix; the CLI exits 2),
building an ssl.SSLContext, an aiohttp middleware for basic auth, and reloading both when the file
changes (mtime, checked at most once a second on request) or on SIGHUP. A reload that fails keeps the
previous configuration and logs why. TLS cannot be switched on or off by a reload: the listening
socket was made with or without it, so that needs a restart (the reload is refused and logged).

Settings Python's ssl module cannot honour are refused, not ignored, when ignoring them would loosen
security: `client_allowed_sans`, `cipher_suites`, `curve_preferences`, and the client-auth modes that
accept an unverified certificate (RequestClientCert, RequireAnyClientCert).

Basic auth: a bcrypt check costs ~0.1-0.3 s by design, too much for every scrape, so a *successful*
check is remembered under an HMAC of (user, password, stored hash) keyed by a per-process random secret;
a changed hash or password misses the cache. Failures are never cached (a guesser pays bcrypt every
time), run in a worker thread (the event loop keeps serving), and an unknown user is checked against a
dummy hash so timing does not reveal which users exist. Nothing here logs a password or a hash.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import os
import secrets
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

import yaml
from aiohttp import web

from rooflight.agent.errors import ConfigError

log = logging.getLogger("rooflight")

_TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users"}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version",
             "prefer_server_cipher_suites"}
_TLS_REFUSED = {
    "client_allowed_sans": "Python's ssl module cannot restrict client SANs; remove it or terminate TLS in a proxy",
    "cipher_suites": "the agent uses OpenSSL's default suites (TLS 1.2+ AEAD); remove it",
    "curve_preferences": "the agent uses OpenSSL's default curves; remove it",
    "cert": "inline certificates are not supported; write the PEM to a file and use cert_file",
    "key": "inline keys are not supported; write the PEM to a file and use key_file",
}
_HTTP_KEYS = {"headers", "http2"}
_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
             "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_BCRYPT_PREFIXES = (b"$2a$", b"$2b$", b"$2y$")
_CACHE_MAX = 256
RELOAD_CHECK_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class TlsConfig:
    cert_file: Path
    key_file: Path
    client_auth: ssl.VerifyMode = ssl.CERT_NONE
    client_ca_file: Path | None = None
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion | None = None
    prefer_server_cipher_suites: bool = True


@dataclass(frozen=True, slots=True)
class WebConfig:
    """One validated web config. `users` maps user name -> bcrypt hash (bytes)."""

    tls: TlsConfig | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


def load(path: str | os.PathLike[str]) -> WebConfig:
    """Read and validate a web config file; ConfigError names the key and what to write instead."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"web config {p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"web config {p}: cannot read it: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"web config {p}: not valid YAML: {exc}") from None
    return parse(data, base=p.parent, where=f"web config {p}")


def parse(data: Any, *, base: Path, where: str = "web config") -> WebConfig:
    """Validate the parsed YAML of a web config; file paths resolve against `base` and must exist."""
    if data is None:
        return WebConfig()
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the top level must be a mapping ({', '.join(sorted(_TOP_KEYS))})")
    _no_unknown(data, _TOP_KEYS, where)
    tls = _tls(data.get("tls_server_config"), base, f"{where}: tls_server_config")
    users = _users(data.get("basic_auth_users"), f"{where}: basic_auth_users")
    headers = _headers(data.get("http_server_config"), f"{where}: http_server_config")
    return WebConfig(tls=tls, users=users, headers=headers)


def _no_unknown(section: Mapping[Any, Any], known: set[str], where: str) -> None:
    for key in section:
        if key in _TLS_REFUSED and known is _TLS_KEYS:
            raise ConfigError(f"{where}.{key}: not supported: {_TLS_REFUSED[key]}")
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}; known: {', '.join(sorted(known))}")


def _tls(section: Any, base: Path, where: str) -> TlsConfig | None:
    if section is None:
        return None
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: must be a mapping")
    _no_unknown(section, _TLS_KEYS, where)
    if not section.get("cert_file") or not section.get("key_file"):
        raise ConfigError(f"{where}: needs both cert_file and key_file (PEM files)")
    auth_name = str(section.get("client_auth_type") or "NoClientCert")
    if auth_name not in _CLIENT_AUTH:
        raise ConfigError(
            f"{where}.client_auth_type: {auth_name!r} is not supported; use one of {', '.join(_CLIENT_AUTH)}"
            " (modes that accept an unverified client certificate are refused)"
        )
    ca = _file(section.get("client_ca_file"), base, f"{where}.client_ca_file") if section.get("client_ca_file") else None
    if ca is not None and auth_name == "NoClientCert":
        raise ConfigError(f"{where}: client_ca_file is set but client_auth_type is NoClientCert; set a client auth type")
    if ca is None and auth_name != "NoClientCert":
        raise ConfigError(f"{where}: client_auth_type {auth_name} needs client_ca_file")
    min_v = _version(section.get("min_version", "TLS12"), f"{where}.min_version")
    max_v = _version(section["max_version"], f"{where}.max_version") if section.get("max_version") else None
    if max_v is not None and max_v < min_v:
        raise ConfigError(f"{where}: max_version is below min_version")
    tls = TlsConfig(
        cert_file=_file(section["cert_file"], base, f"{where}.cert_file"),
        key_file=_file(section["key_file"], base, f"{where}.key_file"),
        client_auth=_CLIENT_AUTH[auth_name], client_ca_file=ca, min_version=min_v, max_version=max_v,
        prefer_server_cipher_suites=bool(section.get("prefer_server_cipher_suites", True)),
    )
    ssl_context(tls)  # a cert that does not load, or a key that does not match it, fails here
    return tls


def _file(value: Any, base: Path, where: str) -> Path:
    path = Path(str(value))
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise ConfigError(f"{where}: {path} is not a readable file")
    return path


def _version(value: Any, where: str) -> ssl.TLSVersion:
    if str(value) not in _VERSIONS:
        raise ConfigError(f"{where}: {value!r}; write one of {', '.join(_VERSIONS)}")
    return _VERSIONS[str(value)]


def _users(section: Any, where: str) -> dict[str, bytes]:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: must map user names to bcrypt hashes")
    out = {}
    for user, hashed in section.items():
        raw = str(hashed or "").encode()
        if not raw.startswith(_BCRYPT_PREFIXES) or len(raw) != 60:
            raise ConfigError(
                f"{where}.{user}: not a bcrypt hash (never put a password here); make one with"
                " `htpasswd -nBC 12 \"\" | tr -d ':\\n'` or"
                " `python -c 'import bcrypt,getpass; print(bcrypt.hashpw(getpass.getpass().encode(), bcrypt.gensalt()).decode())'`"
            )
        if ":" in str(user):
            raise ConfigError(f"{where}: user name {user!r} must not contain ':'")
        out[str(user)] = raw
    return out


def _headers(section: Any, where: str) -> dict[str, str]:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: must be a mapping")
    _no_unknown(section, _HTTP_KEYS, where)
    headers = section.get("headers") or {}
    if not isinstance(headers, dict):
        raise ConfigError(f"{where}.headers: must map header names to values")
    for name, value in headers.items():
        if any(c in f"{name}{value}" for c in "\r\n"):
            raise ConfigError(f"{where}.headers.{name}: no line breaks in header names or values")
        if str(name).lower() in ("authorization", "www-authenticate", "content-type", "content-length"):
            raise ConfigError(f"{where}.headers: {name} is set by the agent, not by configuration")
    return {str(k): str(v) for k, v in headers.items()}


def ssl_context(tls: TlsConfig, into: ssl.SSLContext | None = None) -> ssl.SSLContext:
    """A server SSLContext for `tls` (or `into`, updated in place: new handshakes use the new files)."""
    ctx = into or ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.minimum_version = tls.min_version
        ctx.maximum_version = tls.max_version or ssl.TLSVersion.MAXIMUM_SUPPORTED
        ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
        if tls.client_ca_file is not None:
            ctx.load_verify_locations(cafile=str(tls.client_ca_file))
        ctx.verify_mode = tls.client_auth
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(f"tls_server_config: cannot load {tls.cert_file} / {tls.key_file}: {exc}") from None
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    return ctx


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes, remembering successes only."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)
        self._ok: dict[bytes, None] = {}
        import bcrypt

        self._bcrypt = bcrypt
        self._dummy = bcrypt.hashpw(secrets.token_bytes(16).hex().encode(), bcrypt.gensalt(rounds=10))

    async def check(self, header: str | None, users: Mapping[str, bytes]) -> bool:
        creds = _decode(header)
        if creds is None:
            return False
        user, password = creds
        hashed = users.get(user)
        key = hmac.new(self._key, b"\0".join((user.encode(), password, hashed or b"")), hashlib.sha256).digest()
        if hashed is not None and key in self._ok:
            return True
        ok = await asyncio.to_thread(self._verify, password, hashed)
        if ok:
            if len(self._ok) >= _CACHE_MAX:
                self._ok.clear()
            self._ok[key] = None
        return ok

    def _verify(self, password: bytes, hashed: bytes | None) -> bool:
        try:
            ok = self._bcrypt.checkpw(password, hashed or self._dummy)
        except ValueError:  # a password bcrypt refuses (e.g. a NUL byte) is simply wrong
            return False
        return ok and hashed is not None


def _decode(header: str | None) -> tuple[str, bytes] | None:
    if not header or not header[:6].lower() == "basic ":
        return None
    try:
        raw = base64.b64decode(header[6:].strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    return user.decode("utf-8", errors="replace"), password


class WebSecurity:
    """The live web config: the SSLContext the site listens with, and the auth middleware; reloadable."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.config = load(self.path)
        self._mtime = self._stat()
        self._checked = time.monotonic()
        self.ssl_context = ssl_context(self.config.tls) if self.config.tls else None
        self.auth = BasicAuth()

    def _stat(self) -> float | None:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return None

    def reload(self) -> bool:
        """Re-read the file; on any error keep the current config, log why, and return False."""
        try:
            new = load(self.path)
            if (new.tls is None) != (self.config.tls is None):
                raise ConfigError("switching TLS on or off needs a restart of the agent")
            if new.tls is not None and self.ssl_context is not None:
                ssl_context(new.tls, into=self.ssl_context)
        except ConfigError as exc:
            log.error("web config not reloaded, keeping the previous one: %s", exc)
            return False
        self.config = new
        log.info("web config reloaded from %s (%d user(s), TLS %s)", self.path, len(new.users),
                 "on" if new.tls else "off")
        return True

    def maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_SECONDS:
            return
        self._checked = now
        mtime = self._stat()
        if mtime != self._mtime:
            self._mtime = mtime
            self.reload()

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.maybe_reload()
        config = self.config
        if config.users and not await self.auth.check(request.headers.get("Authorization"), config.users):
            response: web.StreamResponse = web.Response(
                status=401, text="Unauthorized\n", headers={"WWW-Authenticate": 'Basic realm="rooflight"'}
            )
        else:
            response = await handler(request)
        for name, value in config.headers.items():
            response.headers[name] = value
        return response

    def install_sighup(self, loop: asyncio.AbstractEventLoop) -> None:
        """Reload on SIGHUP (Unix), as Prometheus and its exporters do."""
        import signal

        loop.add_signal_handler(signal.SIGHUP, self.reload)
