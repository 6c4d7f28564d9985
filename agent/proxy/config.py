"""The proxy's settings (`rooflight proxy`, and `rooflight run --proxy-listen`), validated once at start: a bad
one raises ConfigError saying what to fix (exit 2). Flags and defaults: agent/config/settings.py."""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from rooflight.agent.config import settings as st
from rooflight.agent.config.agent import AgentConfig
from rooflight.agent.config.urls import credentials, endpoint, parse_upstream, target_name
from rooflight.agent.config.values import bounded_whole, listens_clash, parse_duration, split_listen
from rooflight.agent.errors import ConfigError
from rooflight.agent.proxy.catalog import DEFAULT_BUCKETS, HISTOGRAMS
from rooflight.agent.proxy.slo import SLO, parse_slos

_SETTINGS = {s.key: s for s in st.SETTINGS if st.PROXY in s.commands or s.proxy}  # and run's --proxy-*
DEFAULTS = {key: s.default for key, s in _SETTINGS.items()}


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    upstream: str  # the OpenAI-compatible server's base URL, without a trailing slash or user:password
    listen: str
    metrics_listen: str
    slos: tuple[SLO, ...]
    tenant_header: str | None
    tenant_top: int
    buckets: Mapping[str, tuple[float, ...]]
    windows: Mapping[str, float]
    percentiles: tuple[str, ...]
    read_header_timeout: float  # a request's headers, from its first byte (or the connection's start)
    idle_timeout: float  # a keep-alive connection between requests
    read_body_timeout: float  # the longest a request's body may keep the proxy waiting, its pauses added up
    max_connections: int  # open on the proxy's port at once
    max_connections_per_client: int  # of them, held by one IP address
    connect_timeout: float
    max_buffered_body: int = 16 * 1024 * 1024  # request bodies up to this are read whole, larger ones streamed
    max_buffered_total: int = 64 * 1024 * 1024  # all bodies read whole at once; past it a body is streamed too
    max_accounting_total: int = 64 * 1024 * 1024  # the accounting's copies of answers held at once, in total
    refresh: float = 1.0  # seconds between snapshots of the exports
    request_log: str | None = None  # --request-log: a JSON line per finished request (agent/proxy/journal.py)
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
    request_log: str | None = None,
) -> ProxyConfig:
    """Flags (strings as typed) -> a validated ProxyConfig."""
    listen = listen or DEFAULTS["listen"]
    metrics_listen = metrics_listen or DEFAULTS["metrics_listen"]
    if split_listen(listen) == split_listen(metrics_listen) and split_listen(listen)[1] != 0:
        raise ConfigError(f"{_flag('listen')} and {_flag('metrics_listen')} are both {listen}: the proxy passes every"
                          " path through, so /metrics needs its own port")
    if listens_clash(listen, metrics_listen):  # a wildcard holds the port on every address: the second bind fails
        raise ConfigError(f"{_flag('listen')} {listen} and {_flag('metrics_listen')} {metrics_listen} share port "
                          f"{split_listen(listen)[1]} (a wildcard address holds it on every address): the proxy passes"
                          " every path through, so /metrics needs its own port")
    return ProxyConfig(
        upstream=_check("upstream", upstream),
        upstream_auth=lent_credentials(upstream or "", upstream_credentials_for_anonymous),
        listen=listen,
        metrics_listen=metrics_listen,
        slos=parse_slos(list(slos or ())),
        tenant_header=_check("tenant_header", tenant_header),
        tenant_top=_check("tenant_top", tenant_top),
        buckets=parse_buckets(buckets, _flag("proxy_buckets")),
        windows=_check("windows", windows or DEFAULTS["windows"]),
        percentiles=_check("percentiles", percentiles or DEFAULTS["percentiles"]),
        connect_timeout=_check("connect_timeout", connect_timeout),
        request_log=_check("request_log", request_log),
        **parse_port_limits(read_header_timeout, idle_timeout, max_connections, max_connections_per_client,
                            read_body_timeout),
    )


def parse_port_limits(read_header_timeout: Any, idle_timeout: Any, max_connections: Any,
                      max_connections_per_client: Any, read_body_timeout: Any = None) -> dict[str, Any]:
    """The proxy port's limits (agent/proxy/limits.py); the per-client share defaults to half the cap."""
    limits = {"read_header_timeout": _check("read_header_timeout", read_header_timeout),
              "idle_timeout": _check("idle_timeout", idle_timeout),
              "read_body_timeout": _check("read_body_timeout", read_body_timeout),
              "max_connections": _check("max_connections", max_connections)}
    share = max_connections_per_client
    limits["max_connections_per_client"] = max(1, limits["max_connections"] // 2) if share is None else \
        bounded_whole(share, _flag("max_connections_per_client"), 1, limits["max_connections"])
    return limits


def _check(key: str, value: Any, command: str = st.PROXY) -> Any:
    """`value` (None: the setting's default) checked by its setting's parser, named by its flag."""
    setting = _SETTINGS[key]
    return setting.parse(setting.default if value is None else value, setting.flag(command))


def _flag(key: str, command: str = st.PROXY) -> str:
    return _SETTINGS[key].flag(command)


def for_agent(agent: AgentConfig) -> ProxyConfig | None:
    """`rooflight run --proxy-listen`: the proxy's config from the agent's, None when the proxy is off.

    Same parsers and messages as `rooflight proxy`. /metrics is the agent's (metrics_listen says where),
    windows, percentiles and the refresh follow the agent's, and the `target` label is the engine
    target's own name when the proxy fronts that engine, so client and engine series join on it. The
    port's limits and connect timeout are `rooflight proxy`'s defaults (docs/proxy.md)."""
    if agent.proxy_listen is None or agent.proxy_upstream is None:
        return None
    upstream = parse_upstream(agent.proxy_upstream, _flag("proxy_upstream", st.RUN))
    if credentials(agent.proxy_upstream) is not None:
        raise ConfigError("--proxy-upstream has a user:password: the proxy would lend it to every client that"
                          " connects without its own Authorization; remove it (clients send their own), or run"
                          " `rooflight proxy --upstream-credentials-for-anonymous` to mean exactly that")
    same = [t.name for t in agent.targets if endpoint(t.url) == endpoint(upstream)]
    return ProxyConfig(
        upstream=upstream,
        listen=agent.proxy_listen,
        metrics_listen=agent.listen,
        slos=parse_slos(list(agent.slo)),
        tenant_header=_check("tenant_header", agent.tenant_header, st.RUN),
        tenant_top=_check("tenant_top", agent.tenant_top, st.RUN),
        buckets=parse_buckets(agent.proxy_buckets, _flag("proxy_buckets", st.RUN)),
        windows=dict(agent.windows),
        percentiles=agent.percentiles,
        refresh=agent.interval,
        name=same[0] if len(same) == 1 else "",
        connect_timeout=_check("connect_timeout", None),
        **parse_port_limits(None, None, None, None, None),
    )


def lent_credentials(url: str, for_anonymous: bool) -> str | None:
    """The Authorization value to add to requests without one, from --upstream's user:password.

    Never implied: credentials in the URL would be lent to anyone who reaches the proxy's port, so they
    need --upstream-credentials-for-anonymous, and are refused (exit 2) without it."""
    given = credentials(url)
    if given is None:
        return None
    if not for_anonymous:
        raise ConfigError("--upstream has a user:password: the proxy would lend it to every client that connects"
                          " without its own Authorization; add --upstream-credentials-for-anonymous to mean"
                          " exactly that, or remove it (clients send their own Authorization)")
    return "Basic " + base64.b64encode(":".join(given).encode()).decode("ascii")  # RFC 7617, UTF-8


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
