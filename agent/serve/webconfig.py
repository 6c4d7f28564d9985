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
check is remembered (at most CACHE_MAX, least recently used out) under an HMAC of (user, password,
stored hash) keyed by a per-process random secret, as exporter-toolkit does; a changed hash or password
misses the cache. Failures are never cached. Checks run on their own AUTH_THREADS daemon thread (a
check in progress never holds up a stop), not the event loop's default executor (aiohttp gzips /metrics there), and at most AUTH_QUEUE wait or run
at once in each of two lanes, at most AUTH_PER_CLIENT of them one client's. A client that has not failed
a check within FAILED_LATELY_S (or has logged in since) checks in the first lane, served before the other: however many addresses
keep the second lane full of wrong passwords, a first login from an address that has not failed waits for
the check running and the first lane's, never for theirs, and is never refused for their backlog. In each
lane waiting checks are served one client at a time in turn, so a client with a backlog delays another by
one check, not by its backlog. A client (by IP) gets
FAIL_BURST failed checks, then one per 1/FAIL_PER_SECOND s, and past that is answered 429 without
bcrypt, after LIMITED_DELAY (a flood's loop then spins at 1/LIMITED_DELAY per connection; during the wait the
connection gives way at the connection cap, so the waits hold no place another address needs). Every check
costs what one at the configured users' highest cost does: an unknown user is checked against a stand-in
hash of that cost, and a check of a user whose hash is cheaper (cost c) is topped up with stand-in checks
of costs c, c+1, ..., max-1 (2^c + 2^c + 2^(c+1) + ... + 2^(max-1) = 2^max), so timing reveals neither which users exist nor their
costs; a cost above MAX_COST is
refused at load (a cost-31 hash takes days to check), and so is a reload that brings one. Nothing here logs a password or a
hash, and a YAML error reports its line and kind, not the line's text.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import hashlib
import hmac
import logging
import math
import os
import re
import secrets
import ssl
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

from aiohttp import web

from rooflight.agent.errors import ConfigError
from rooflight.agent.config.yamlfile import read_yaml
from rooflight.collectors.daemon_executor import DaemonThreadExecutor

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
CACHE_MAX = 256  # remembered successful credentials
AUTH_THREADS = 1  # bcrypt checks run at once: at most one core, whatever the load
AUTH_QUEUE = 32  # bcrypt checks running or waiting in one lane, all its clients together; past it: 429
AUTH_PER_CLIENT = 2  # ... of which one client IP may hold; past it: 429, and the attempt is spent
LIMITED_DELAY = 1.0  # seconds a 429 waits before it is sent: a looping client then costs ~nothing
FAIL_BURST = 10  # failed checks one client IP may make at once ...
FAIL_PER_SECOND = 1.0  # ... and then at this rate; past it: 429 without bcrypt
FAILED_LATELY_S = 300.0  # a client that failed a check this recently (and has not logged in since) checks in
# the second lane
MAX_CLIENTS_TRACKED = 4096  # client IPs whose failures are remembered (least recently seen out)
DEFAULT_COST = 12
MIN_COST, MAX_COST = 4, 14  # bcrypt's floor; past 14 one check takes seconds and a stand-in hash minutes
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
    data = read_yaml(p, "web config")  # a syntax error says line and kind, never the line (a hash)
    return parse(data, base=p.parent, where=f"web config {p}")


def parse(data: Any, *, base: Path, where: str = "web config") -> WebConfig:
    """Validate the parsed YAML of a web config; file paths resolve against `base` and must exist."""
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{where}: the top level must be a mapping ({', '.join(sorted(_TOP_KEYS))})")
    data = data or {}
    _no_unknown(data, _TOP_KEYS, where)
    if "basic_auth_users" in data and not data["basic_auth_users"]:
        raise ConfigError(f"{where}: basic_auth_users is empty, which would serve with authentication off;"
                          " add a user (name: bcrypt hash) or remove the key")
    tls = _tls(data.get("tls_server_config"), base, f"{where}: tls_server_config")
    users = _users(data.get("basic_auth_users"), f"{where}: basic_auth_users")
    headers = _headers(data.get("http_server_config"), f"{where}: http_server_config")
    if tls is None and not users:
        # An empty file given as --web-config is a mistake, not a wish for no security: serving without TLS
        # and auth would then look configured and not be. Response headers alone guard nothing either.
        what = ("sets only response headers (http_server_config)" if headers else
                "configures nothing (no tls_server_config, basic_auth_users or http_server_config)")
        raise ConfigError(f"{where}: {what}, so it would serve with authentication off and without TLS;"
                          " add basic_auth_users or tls_server_config, or drop --web-config (web_config) to"
                          " serve plain HTTP on purpose")
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
        cost = _cost_of(raw)
        if cost is None or not MIN_COST <= cost <= MAX_COST:
            bound = f"at most {MAX_COST}" if cost is not None and cost > MAX_COST else f"{MIN_COST} to {MAX_COST}"
            raise ConfigError(
                f"{where}: bcrypt cost {'(unreadable)' if cost is None else cost} for user {user}: {bound}; rehash"
                f" the password at cost {DEFAULT_COST}, e.g. `htpasswd -nBC {DEFAULT_COST} \"\" | tr -d ':\\n'`"
            )
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
        _check_header(str(name), str(value), f"{where}.headers")
    return {str(k): str(v) for k, v in headers.items()}


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 7230 token: a header name
_FIELD_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e\t]*[\x21-\x7e])?|")  # visible ASCII, inner spaces/tabs
_AGENT_SET = {"authorization", "www-authenticate", "content-type", "content-encoding", "retry-after"}
_FRAMING = {"content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer",
            "proxy-connection", "proxy-authenticate", "proxy-authorization", "host"}


def _check_header(name: str, value: str, where: str) -> None:
    """A header the agent can add to every response without breaking it; ConfigError otherwise.

    Nothing of the value is echoed: a misplaced secret should not land in a log."""
    if not _TOKEN.fullmatch(name):
        raise ConfigError(f"{where}: {name[:64]!r} is not a header name (letters, digits and !#$%&'*+.^_`|~- only,"
                          " no spaces)")
    if name.lower() in _FRAMING:
        raise ConfigError(f"{where}.{name}: a connection or framing header; it would break every response")
    if name.lower() in _AGENT_SET:
        raise ConfigError(f"{where}.{name}: set by the agent, not by configuration")
    if not _FIELD_VALUE.fullmatch(value):
        raise ConfigError(f"{where}.{name}: the value must be printable ASCII (spaces and tabs inside only;"
                          " no control characters, NUL or line breaks)")


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


def _cost_of(hashed: bytes) -> int | None:
    """The two cost digits of $2b$NN$..., None when they are not two digits followed by '$'."""
    digits = hashed[4:6]
    return int(digits) if digits.isdigit() and hashed[6:7] == b"$" else None


def bcrypt_cost(hashed: bytes) -> int:
    """The cost (log2 rounds) of a bcrypt hash like $2b$12$..., DEFAULT_COST if unreadable or out of bounds.

    Never above MAX_COST: the stand-in hash for unknown users is made at this cost."""
    cost = _cost_of(hashed)
    return cost if cost is not None and MIN_COST <= cost <= MAX_COST else DEFAULT_COST


class FailureLimiter:
    """A token bucket per client: FAIL_BURST attempts, refilled at FAIL_PER_SECOND; bounded in clients."""

    def __init__(self, burst: int = FAIL_BURST, per_second: float = FAIL_PER_SECOND,
                 max_clients: int = MAX_CLIENTS_TRACKED, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.per_second, self.max_clients = burst, per_second, max_clients
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, when)
        self._failed: OrderedDict[str, float] = OrderedDict()  # client -> when it last failed a check

    def take(self, client: str) -> bool:
        """Spend one attempt for `client`; False when it has none left (answer 429)."""
        tokens = self._tokens(client)
        if tokens < 1.0:
            return False
        self._buckets[client] = (tokens - 1.0, self._clock())
        return True

    def failed_lately(self, client: str) -> bool:
        """Whether `client` failed a check within FAILED_LATELY_S and has not logged in since."""
        when = self._failed.get(client)
        return when is not None and self._clock() - when < FAILED_LATELY_S

    def failed(self, client: str) -> None:
        self._failed.pop(client, None)
        self._failed[client] = self._clock()  # most recent last
        while len(self._failed) > self.max_clients:
            self._failed.popitem(last=False)

    def succeeded(self, client: str) -> None:
        self._failed.pop(client, None)
        self.give_back(client)

    def give_back(self, client: str) -> None:
        """A check that succeeded (or never ran) does not count against the client."""
        self._buckets[client] = (min(float(self.burst), self._tokens(client) + 1.0), self._clock())

    def retry_after(self, client: str) -> int:
        """Whole seconds until `client` may try again."""
        return max(1, math.ceil((1.0 - self._tokens(client)) / self.per_second))

    def _tokens(self, client: str) -> float:
        now = self._clock()
        tokens, when = self._buckets.pop(client, (float(self.burst), now))
        self._buckets[client] = (tokens, when)  # most recently seen last
        while len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
        return min(float(self.burst), tokens + (now - when) * self.per_second)


OK, DENIED, LIMITED = 200, 401, 429
WEB_HEADERS = web.RequestKey("web_headers", Mapping)  # where the server finds http_server_config.headers


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes on its own bounded pool, remembering successes."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)
        self._ok: OrderedDict[bytes, None] = OrderedDict()
        # AUTH_THREADS (one) daemon thread: a check still running cannot keep a stopping agent alive.
        self._pool = DaemonThreadExecutor("rooflight-auth")
        self._pending = [0, 0]  # checks running or waiting per lane: 0, clients that have not failed lately; 1, the rest
        self._per_client: dict[str, int] = {}  # checks running or waiting, per client (the loop's count)
        # per lane, client -> its waiting checks
        self._turns: tuple[OrderedDict[str, deque[Callable[[], None]]], ...] = (OrderedDict(), OrderedDict())
        self._turns_lock = threading.Lock()
        self.limiter = FailureLimiter()
        import bcrypt

        self._bcrypt = bcrypt
        self._cost = DEFAULT_COST
        self._top_up_to = MIN_COST  # the users' highest cost once prepare() knows them: no top-ups before
        self._dummies: dict[int, bytes] = {}
        self._dummy_lock = threading.Lock()

    def prepare(self, users: Mapping[str, bytes], *, now: bool = True) -> None:
        """Make the stand-in hashes: for unknown users at the users' (highest) cost, and the top-ups of the
        cheaper users' costs (see the module docstring); now, or on the pool."""
        self._cost = max((bcrypt_cost(h) for h in users.values()), default=DEFAULT_COST)
        costs = {self._cost, *(c for h in users.values() for c in top_up_costs(bcrypt_cost(h), self._cost))}
        self._top_up_to = self._cost
        for cost in sorted(costs):
            if now:
                self.dummy(cost)
            else:
                self._pool.submit(self.dummy, cost)

    def dummy(self, cost: int) -> bytes:
        """A bcrypt hash of a random password at `cost`, made once per cost."""
        with self._dummy_lock:
            if cost not in self._dummies:
                secret = secrets.token_bytes(16).hex().encode()
                self._dummies[cost] = self._bcrypt.hashpw(secret, self._bcrypt.gensalt(rounds=cost))
            return self._dummies[cost]

    async def check(self, header: str | None, users: Mapping[str, bytes], client: str = "") -> bool:
        return await self.decide(header, users, client) == OK

    async def decide(self, header: str | None, users: Mapping[str, bytes], client: str = "") -> int:
        """OK, DENIED, or LIMITED (too many failures from this client, or too many checks queued)."""
        creds = _decode(header)
        if creds is None:
            return DENIED
        user, password = creds
        hashed = users.get(user)
        key = hmac.new(self._key, b"\0".join((user.encode(), password, hashed or b"")), hashlib.sha256).digest()
        if hashed is not None and key in self._ok:
            self._ok.move_to_end(key)
            return OK
        lane = int(self.limiter.failed_lately(client))
        if not self.limiter.take(client):
            return LIMITED
        if self._per_client.get(client, 0) >= AUTH_PER_CLIENT:
            return LIMITED  # its own backlog is full: the attempt is spent, the others' share untouched
        if self._pending[lane] >= AUTH_QUEUE:
            self.limiter.give_back(client)  # everyone's queue is full: not this client's doing
            return LIMITED
        self._pending[lane] += 1
        self._per_client[client] = self._per_client.get(client, 0) + 1
        try:
            ok = await asyncio.wrap_future(self._in_turn(client, lane, lambda: self._verify(password, hashed)))
        finally:
            self._pending[lane] -= 1
            left = self._per_client.pop(client) - 1
            if left:
                self._per_client[client] = left
        if not ok:
            self.limiter.failed(client)
            return DENIED
        self.limiter.succeeded(client)
        self._ok[key] = None
        while len(self._ok) > CACHE_MAX:
            self._ok.popitem(last=False)
        return OK

    def _in_turn(self, client: str, lane: int, check: Callable[[], bool]) -> concurrent.futures.Future[bool]:
        """Run `check` on the pool when `client`'s turn in `lane` comes: the first lane's checks go first, and
        in a lane clients with waiting checks take turns."""
        done: concurrent.futures.Future[bool] = concurrent.futures.Future()

        def job() -> None:
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(check())
                except BaseException as exc:  # handed to the waiting request
                    done.set_exception(exc)

        with self._turns_lock:
            self._turns[lane].setdefault(client, deque()).append(job)
        self._pool.submit(self._next_turn)  # one submission per check: each runs the next client's oldest
        return done

    def _next_turn(self) -> None:
        with self._turns_lock:
            turns = self._turns[0] or self._turns[1]
            client, jobs = next(iter(turns.items()))
            job = jobs.popleft()
            if jobs:
                turns.move_to_end(client)  # its next check waits for every other client's
            else:
                del turns[client]
        job()

    def _verify(self, password: bytes, hashed: bytes | None) -> bool:
        try:
            ok = self._bcrypt.checkpw(password, hashed or self.dummy(self._cost))
        except ValueError:  # a password bcrypt refuses (e.g. a NUL byte) is simply wrong
            return False
        if hashed is not None:
            for cost in top_up_costs(bcrypt_cost(hashed), self._top_up_to):  # as long as one at the top cost
                self._bcrypt.checkpw(b"x", self.dummy(cost))
        return ok and hashed is not None


def top_up_costs(cost: int, target: int) -> list[int]:
    """Stand-in checks that bring one check at `cost` to the time of one at `target`: c, c+1, ..., target-1."""
    return list(range(cost, target))


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
        self.auth.prepare(self.config.users)

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
            if self.config.users and not new.users:
                raise ConfigError("it has no basic_auth_users, which would switch authentication off;"
                                  " restart the agent to do that on purpose")
            if new.tls is not None and self.ssl_context is not None:
                ssl_context(new.tls, into=self.ssl_context)
        except ConfigError as exc:
            log.error("web config not reloaded, keeping the previous one: %s", exc)
            return False
        self.config = new
        self.auth.prepare(new.users, now=False)
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
        request[WEB_HEADERS] = config.headers  # a streamed answer is sent before this returns: see server.py
        status = OK
        if config.users:
            client = request.remote or ""
            status = await self.auth.decide(request.headers.get("Authorization"), config.users, client)
        if status == DENIED:
            response: web.StreamResponse = web.Response(
                status=401, text="Unauthorized\n", headers={"WWW-Authenticate": 'Basic realm="rooflight"'}
            )
        elif status == LIMITED:
            await _limited_wait(request)  # a client looping on 429 now costs the agent ~nothing
            response = web.Response(status=429, text="Too many failed logins; try again later\n",
                                    headers={"Retry-After": str(self.auth.limiter.retry_after(client))})
        else:
            response = await handler(request)
        for name, value in config.headers.items():
            response.headers[name] = value
        return response

    def install_sighup(self, loop: asyncio.AbstractEventLoop) -> None:
        """Reload on SIGHUP (Unix), as Prometheus and its exporters do."""
        import signal

        loop.add_signal_handler(signal.SIGHUP, self.reload)


async def _limited_wait(request: web.Request) -> None:
    """Wait LIMITED_DELAY before a 429, the connection marked as giving way at the connection cap meanwhile
    (server.py's handler: set_waiting): a flood's delayed 429s then never hold places another address needs."""
    mark: Callable[[bool], None] | None = getattr(request.protocol, "set_waiting", None)
    if mark is not None:
        mark(True)
    try:
        await asyncio.sleep(LIMITED_DELAY)
    finally:
        if mark is not None:
            mark(False)
