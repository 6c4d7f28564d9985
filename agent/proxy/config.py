"""The proxy's settings, validated once at start: a bad one raises ConfigError saying what to fix (exit 2)."""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence
from urllib.parse import unquote, urlsplit, urlunsplit

from rooflight.agent.errors import ConfigError
from rooflight.agent.proxy.catalog import DEFAULT_BUCKETS, HISTOGRAMS
from rooflight.agent.proxy.slo import SLO, parse_slos
from rooflight.agent.sampling.config import (
    AgentConfig,
    parse_duration,
    parse_percentiles,
    parse_windows,
    redacted_url,
    split_listen,
    target_name,
)

DEFAULT_LISTEN = "127.0.0.1:8100"  # where clients connect (not 8000, the engines' default, nor 8080, llama.cpp's)
DEFAULT_METRICS_LISTEN = "127.0.0.1:9748"  # next to the agent's 9746
DEFAULT_WINDOWS = "10s,1m,5m"
DEFAULT_PERCENTILES = "50,90,99"


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    upstream: str  # the OpenAI-compatible server's base URL, without a trailing slash or user:password
    listen: str = DEFAULT_LISTEN
    metrics_listen: str = DEFAULT_METRICS_LISTEN
    slos: tuple[SLO, ...] = ()
    tenant_header: str | None = None
    tenant_top: int = 10
    buckets: Mapping[str, tuple[float, ...]] = field(default_factory=lambda: dict(DEFAULT_BUCKETS))
    windows: Mapping[str, float] = field(default_factory=lambda: {"10s": 10.0, "1m": 60.0, "5m": 300.0})
    percentiles: tuple[str, ...] = ("50", "90", "99")
    connect_timeout: float = 10.0
    max_buffered_body: int = 16 * 1024 * 1024  # request bodies up to this are read whole, larger ones streamed
    max_buffered_total: int = 64 * 1024 * 1024  # all bodies read whole at once; past it a body is streamed too
    max_accounting_total: int = 64 * 1024 * 1024  # the accounting's copies of answers held at once, in total
    refresh: float = 1.0  # seconds between snapshots of the exports
    read_header_timeout: float = 10.0  # a request's headers, from its first byte (or the connection's start)
    idle_timeout: float = 60.0  # a keep-alive connection between requests
    read_body_timeout: float = 10.0  # the longest wait for the next byte of a request's body
    max_connections: int = 4096  # open on the proxy's port at once
    max_connections_per_client: int = 2048  # of them, held by one IP address
    name: str = ""  # the `target` label when given (`rooflight run`: the engine target's own name)
    # The Authorization value made from --upstream's user:password, added to requests that carry none of
    # their own (only with --upstream-credentials-for-anonymous: anyone who reaches the port is lent it).
    upstream_auth: str | None = field(default=None, repr=False)

    @property
    def target(self) -> str:
        """The `target` label: `name`, else the upstream's host:port, as the engine side names an engine."""
        return self.name or target_name(self.upstream)


def build(
    upstream: str | None,
    *,
    listen: str | None = None,
    metrics_listen: str | None = None,
    slos: Sequence[str] | None = None,
    tenant_header: str | None = None,
    tenant_top: Any = None,
    buckets: Sequence[str] | None = None,
    windows: str | None = None,
    percentiles: str | None = None,
    connect_timeout: Any = None,
    upstream_credentials_for_anonymous: bool = False,
    read_header_timeout: Any = None,
    idle_timeout: Any = None,
    max_connections: Any = None,
    max_connections_per_client: Any = None,
    read_body_timeout: Any = None,
) -> ProxyConfig:
    """Flags (strings as typed) -> a validated ProxyConfig."""
    listen = listen or DEFAULT_LISTEN
    metrics_listen = metrics_listen or DEFAULT_METRICS_LISTEN
    if split_listen(listen) == split_listen(metrics_listen) and split_listen(listen)[1] != 0:
        raise ConfigError(f"--listen and --metrics-listen are both {listen}: the proxy passes every path through, "
                          "so /metrics needs its own port")
    return ProxyConfig(
        upstream=parse_upstream(upstream),
        upstream_auth=lent_credentials(upstream or "", upstream_credentials_for_anonymous),
        listen=listen,
        metrics_listen=metrics_listen,
        slos=parse_slos(list(slos or ())),
        tenant_header=_header_name(tenant_header),
        tenant_top=_count(tenant_top, "--tenant-top", 10),
        buckets=parse_buckets(buckets),
        windows=parse_windows(windows or DEFAULT_WINDOWS, "--windows"),
        percentiles=parse_percentiles(percentiles or DEFAULT_PERCENTILES, "--percentiles", required=True),
        connect_timeout=parse_duration(connect_timeout if connect_timeout is not None else "10s", "--connect-timeout"),
        **parse_port_limits(read_header_timeout, idle_timeout, max_connections, max_connections_per_client,
                            read_body_timeout),
    )


def parse_port_limits(read_header_timeout: Any, idle_timeout: Any, max_connections: Any,
                      max_connections_per_client: Any, read_body_timeout: Any = None) -> dict[str, Any]:
    """The proxy port's limits (agent/proxy/limits.py); the per-client share defaults to half the cap."""
    header = parse_duration(read_header_timeout if read_header_timeout is not None else "10s", "--read-header-timeout")
    idle = parse_duration(idle_timeout if idle_timeout is not None else "60s", "--idle-timeout")
    body = parse_duration(read_body_timeout if read_body_timeout is not None else "10s", "--read-body-timeout")
    for value, what in ((header, "--read-header-timeout"), (idle, "--idle-timeout"), (body, "--read-body-timeout")):
        if not 0 < value <= 3600:
            raise ConfigError(f"{what}: {value:g} s: give a time between 1ms and 1h, e.g. {what} 10s")
    cap = _whole(max_connections, "--max-connections", 4096, 1, 1_000_000)
    share = _whole(max_connections_per_client, "--max-connections-per-client", max(1, cap // 2), 1, cap)
    return {"read_header_timeout": header, "idle_timeout": idle, "read_body_timeout": body, "max_connections": cap,
            "max_connections_per_client": share}


def _whole(value: Any, what: str, default: int, low: int, high: int, why: str = "") -> int:
    if value is None:
        return default
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: {value!r} is not a whole number") from None
    if not low <= number <= high:
        raise ConfigError(f"{what}: {number} must be between {low} and {high}{why}")
    return number


def for_agent(agent: AgentConfig) -> ProxyConfig | None:
    """`rooflight run --proxy-listen`: the proxy's config from the agent's, None when the proxy is off.

    Same parsers and messages as `rooflight proxy`. /metrics is the agent's (metrics_listen says where),
    windows, percentiles and the refresh follow the agent's, and the `target` label is the engine
    target's own name when the proxy fronts that engine, so client and engine series join on it."""
    if agent.proxy_listen is None or agent.proxy_upstream is None:
        return None
    upstream = parse_upstream(agent.proxy_upstream, "--proxy-upstream")
    if _credentials(agent.proxy_upstream) is not None:
        raise ConfigError("--proxy-upstream has a user:password: the proxy would lend it to every client that"
                          " connects without its own Authorization; remove it (clients send their own), or run"
                          " `rooflight proxy --upstream-credentials-for-anonymous` to mean exactly that")
    same = [t.name for t in agent.targets if _endpoint(t.url) == _endpoint(upstream)]
    return ProxyConfig(
        upstream=upstream,
        listen=agent.proxy_listen,
        metrics_listen=agent.listen,
        slos=parse_slos(list(agent.slo)),
        tenant_header=_header_name(agent.tenant_header),
        tenant_top=_count(agent.tenant_top, "--tenant-top", 10),
        buckets=parse_buckets(agent.proxy_buckets, "--proxy-buckets"),
        windows=dict(agent.windows),
        percentiles=agent.percentiles,
        refresh=agent.interval,
        name=same[0] if len(same) == 1 else "",
    )


def _endpoint(url: str) -> tuple[str, int | None]:
    """(host, port) with the scheme's default port filled in: http://vllm and http://vllm:80 are one engine."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return (parts.hostname or "").lower(), port if port is not None else default


def parse_upstream(url: str | None, what: str = "--upstream") -> str:
    if not url:
        raise ConfigError(f"{what} is required: the OpenAI-compatible server's URL, e.g. http://127.0.0.1:8000")
    rest = url.strip().partition("://")[2]
    if "@" in rest[min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest)):]:
        raise ConfigError(f"{what}: its user:password part holds an unescaped '/', '?' or '#' (or the path holds '@'):"
                          " percent-encode them in the password (/ -> %2F, ? -> %3F, # -> %23, @ -> %40)")
    try:
        parts = urlsplit(url.strip())
    except ValueError:  # "Invalid IPv6 URL": an unclosed '[' or a ']' out of place
        raise ConfigError(f"{what} '{shown_url(url)}': not a valid URL; an IPv6 address goes in brackets,"
                          " e.g. http://[::1]:8000") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{what} '{shown_url(url)}': write http://HOST:PORT (or https://), e.g. http://127.0.0.1:8000")
    if parts.query or parts.fragment:
        raise ConfigError(f"{what} '{shown_url(url)}': give the base URL only, without ?query or #fragment")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise ConfigError(f"{what} '{shown_url(url)}': the port is not a number between 0 and 65535") from None
    if "@" in parts.netloc:
        parts = parts._replace(netloc=parts.netloc.rpartition("@")[2])  # never in the URL requests are sent to
    return urlunsplit(parts).rstrip("/")


def shown_url(url: str) -> str:
    """The upstream URL as a message or log line may show it: no user:password, query or fragment (a
    `?token=` is a secret too), and no raw control character (an escape sequence would reach a terminal)."""
    shown = redacted_url(url.strip())
    scheme, sep, rest = shown.partition("://")
    cut = min((i for i in map(rest.find, "?#") if i >= 0), default=-1)
    if cut >= 0:
        rest = rest[:cut] + ("?..." if rest[cut] == "?" else "#...")
    return printable(f"{scheme}{sep}{rest}")


def printable(text: str) -> str:
    """`text` with every non-printable character written as a Python escape (\\x1b, \\u200b)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _credentials(url: str | None) -> tuple[str, str] | None:
    """The (user, password) of a URL's user:password part, percent-decoded; None when it has none."""
    if not url:
        return None
    parts = urlsplit(url.strip())
    if "@" not in parts.netloc:
        return None
    user, _, password = parts.netloc.rpartition("@")[0].partition(":")
    return unquote(user), unquote(password)


def lent_credentials(url: str, for_anonymous: bool) -> str | None:
    """The Authorization value to add to requests without one, from --upstream's user:password.

    Never implied: credentials in the URL would be lent to anyone who reaches the proxy's port, so they
    need --upstream-credentials-for-anonymous, and are refused (exit 2) without it."""
    credentials = _credentials(url)
    if credentials is None:
        return None
    if not for_anonymous:
        raise ConfigError("--upstream has a user:password: the proxy would lend it to every client that connects"
                          " without its own Authorization; add --upstream-credentials-for-anonymous to mean"
                          " exactly that, or remove it (clients send their own Authorization)")
    return "Basic " + base64.b64encode(":".join(credentials).encode()).decode("ascii")  # RFC 7617, UTF-8


def parse_buckets(items: Sequence[str] | None, what: str = "--buckets") -> dict[str, tuple[float, ...]]:
    """`--buckets itl=0.005,0.01,0.02` (repeatable): replaces that histogram's edges."""
    out = dict(DEFAULT_BUCKETS)
    seen: set[str] = set()
    for item in items or ():
        key, sep, values = str(item).partition("=")
        key = key.strip().lower()
        if not sep or key not in HISTOGRAMS:
            raise ConfigError(f"{what} {item!r}: write NAME=EDGE,EDGE,... with NAME one of {', '.join(HISTOGRAMS)}, "
                              f"e.g. {what} itl=0.005,0.01,0.02,0.05")
        if key in seen:
            raise ConfigError(f"{what} {key} is given twice")
        seen.add(key)
        edges = sorted({parse_duration(v.strip(), f"{what} {key}") for v in values.split(",") if v.strip()})
        if not edges or not all(math.isfinite(e) for e in edges):
            raise ConfigError(f"{what} {item!r}: give at least one finite edge (+Inf is always added)")
        out[key] = tuple(edges)
    return out


def _header_name(name: str | None) -> str | None:
    if name is None:
        return None
    name = name.strip()
    if not name or any(ch in name for ch in " :\t\r\n"):
        raise ConfigError(f"--tenant-header {name!r}: give a header name, e.g. X-Tenant-Id")
    return name


def _count(value: Any, what: str, default: int) -> int:
    return _whole(value, what, default, 0, 1000, " (each is a label value on several series)")
    return number
