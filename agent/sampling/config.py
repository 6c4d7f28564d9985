"""The agent's configuration: flags over environment variables over a YAML file over defaults.

Everything is validated here, once, at start: a bad value raises ConfigError with what to fix, and the
CLI turns that into exit code 2. What the rest of the agent sees is frozen.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

import yaml

from rooflight.agent.errors import ConfigError
from rooflight.collectors.http import DEFAULT_MAX_BODY_BYTES

DEFAULT_LISTEN = "127.0.0.1:9746"
ENV_PREFIX = "ROOFLIGHT_"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
MAX_DURATION_SECONDS = 86400.0  # a day: longer than any window or timeout the agent has a use for
MAX_SCRAPE_TIMEOUT_SECONDS = 300.0
# YAML files (this config and the web config) are small; these bound what a hostile or broken file costs
MAX_CONFIG_BYTES = 1024 * 1024
MAX_YAML_ALIASES = 32  # `*name` references; a real config needs a handful at most
MAX_YAML_NODES = 20_000  # scalars, lists and mappings as written
MAX_YAML_EXPANDED = 100_000  # the same counted with every alias expanded (a "billion laughs" stops here)
MAX_YAML_EXPANDED_CHARS = 4 * 1024 * 1024  # text in all strings, aliases expanded


@dataclass(frozen=True, slots=True)
class TargetConfig:
    """One engine endpoint and what the agent must know about the model behind it."""

    url: str
    name: str = ""
    engine: str = "auto"
    metrics_path: str | None = None
    model: str | None = None  # a preset name
    model_config: str | None = None  # path to a Hugging Face config.json
    weight_dtype: str | None = None
    kv_dtype: str | None = None
    gpu: str | None = None  # a GPU profile key; None = from NVML (a GPU with no profile: none), else h100-sxm
    tp: int | None = None  # where the engine does not say; None = NVML's GPUs / DP ranks, else 1
    batch_max: int | None = None  # the engine's batch cap where its /metrics does not say
    ep: int | None = None  # expert-parallel size: GPUs the routed experts are spread over (DP+EP MoE)
    draft_model: str | None = None  # speculative decoding's draft model: a preset or a Hugging Face id
    draft_model_config: str | None = None  # ... or its config.json
    pid: int | None = None  # the engine's process, for CPU/RSS (else found by the URL's port)
    # Capacity signals (agent/signals/headroom.py, docs/metrics.md section Capacity, cost and energy).
    role: str | None = None  # prefill, decode or both; None = what the engine says, else both
    ttft_slo: float | None = None  # seconds; gives rooflight_headroom_ratio{resource="ttft_slo"}
    itl_slo: float | None = None  # seconds; gives rooflight_headroom_ratio{resource="itl_slo"}
    gpu_hour_cost: float | None = None  # price of one GPU per hour, any currency; gives the cost metrics


@dataclass(frozen=True, slots=True)
class AgentConfig:
    targets: tuple[TargetConfig, ...]
    listen: str = DEFAULT_LISTEN
    interval: float = 1.0
    scrape_timeout: float = 5.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # sized for real engines: docs/reliability.md
    max_series: int = 128  # (model, rank) series kept per target; more are dropped and counted
    windows: Mapping[str, float] = field(default_factory=lambda: {"10s": 10.0, "1m": 60.0, "5m": 300.0})
    percentiles: tuple[str, ...] = ("50", "90", "99")
    nvml: bool = True
    nvml_interval: float = 1.0
    gpus: str = "own"  # GPUs exported: "own" (the targets' engines', docs/metrics.md) or "all" (a node-level agent)
    process: bool = True
    web_config: str | None = None
    detectors: Mapping[str, float] = field(default_factory=dict)
    read_header_timeout: float = 10.0  # a client must send a request's headers within this (slowloris)
    max_connections: int = 256  # open HTTP connections to the agent; more are answered 503 and closed
    # The client-side proxy (`rooflight proxy` in the same process, docs/proxy.md): on when proxy_listen
    # is set. Its SLO and bucket spellings are parsed by agent/proxy/config.py, with `rooflight proxy`'s messages.
    proxy_listen: str | None = None
    proxy_upstream: str | None = None  # resolved here: default the one target's URL (without user:password)
    slo: tuple[str, ...] = ()  # joint SLOs as written, e.g. ("ttft=0.5,tpot=0.05",)
    tenant_header: str | None = None
    tenant_top: int = 10
    proxy_buckets: tuple[str, ...] = ()  # histogram edges as written, e.g. ("itl=0.005,0.01",)

    @property
    def listen_host(self) -> str:
        return split_listen(self.listen)[0]

    @property
    def listen_port(self) -> int:
        return split_listen(self.listen)[1]


def parse_duration(value: Any, what: str) -> float:
    """'10s', '1m', '250ms' or a number of seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value).strip())
        if not match:
            raise ConfigError(f"{what}: {value!r} is not a duration; write e.g. 1s, 250ms, 1m or 0.5")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if not math.isfinite(seconds):
        raise ConfigError(f"{what}: {value!r} is not a finite duration; write e.g. 1s, 250ms or 1m")
    if seconds <= 0:
        raise ConfigError(f"{what}: must be more than zero, got {value!r}")
    if seconds > MAX_DURATION_SECONDS:
        raise ConfigError(f"{what}: {value!r} is longer than a day; write a shorter duration")
    return seconds


def split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen address {listen!r}: write HOST:PORT, e.g. {DEFAULT_LISTEN} or 0.0.0.0:9746")
    return host.strip("[]") or "0.0.0.0", int(port)


def target_name(url: str) -> str:
    """host:port of an engine URL, never its user:password (the name is a label and appears in logs)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    shown = f"[{host}]" if ":" in host else host
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{shown}:{port}" if port is not None else shown


def public_url(url: str) -> str:
    """The URL as the agent may show it: scheme://host:port/path, never user:password, query or fragment.

    Only for URLs check_engine_url accepted (their userinfo cannot spill into the path)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{target_name(url)}{parts.path}" if parts.scheme else target_name(url)


def check_engine_url(url: str) -> None:
    """Refuse an engine URL whose user:password would be read as host, path or query (exit 2).

    In `http://admin:p/ss@host` the unescaped `/` ends the authority early: urlsplit reads the host as
    `admin`, the password as part of the path, and a label or a log line made from the host or the
    path would carry the secret. Nothing of the URL is echoed back: it may hold a password."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise ConfigError(f"engine URL {redacted_url(url)!r}: write it as http://HOST:PORT (the engine's API base)")
    authority_end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    if "@" in rest[authority_end:]:
        raise ConfigError(
            "engine URL: its user:password part holds an unescaped '/', '?' or '#' (or the path holds '@'):"
            " percent-encode them in the password (/ -> %2F, ? -> %3F, # -> %23, @ -> %40)"
        )
    try:
        parts = urlsplit(url)
    except ValueError:  # "Invalid IPv6 URL": an unclosed '[' or a ']' out of place
        raise ConfigError(f"engine URL {redacted_url(url)!r}: not a valid URL; an IPv6 address goes in brackets,"
                          " e.g. http://[::1]:8000") from None
    try:
        parts.port
    except ValueError:
        raise ConfigError(f"engine URL {redacted_url(url)!r}: the port is not a number 0-65535") from None
    if not parts.hostname:
        raise ConfigError(f"engine URL {redacted_url(url)!r}: write it as http://HOST:PORT (the engine's API base)")


def redacted_url(url: str) -> str:
    """A malformed URL as an error message may show it: any user:password replaced by ***."""
    scheme, sep, rest = url.partition("://")
    head, at, tail = rest.rpartition("@") if sep else url.rpartition("@")
    shown = f"***@{tail}" if at else (rest if sep else url)
    return f"{scheme}{sep}{shown}" if sep else shown


def read_yaml(path: str | os.PathLike[str], what: str) -> Any:
    """Load a small YAML file (a config or web config) or raise ConfigError naming what to fix.

    Bounded: at most MAX_CONFIG_BYTES of UTF-8, MAX_YAML_ALIASES aliases, MAX_YAML_NODES nodes, and
    MAX_YAML_EXPANDED nodes or MAX_YAML_EXPANDED_CHARS of text once aliases are expanded (an alias bomb
    is cheap to load and explodes only when the values are used). A syntax error reports its line,
    column and kind only: never the offending line, which may be a password or a bcrypt hash."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{what} {p}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {p}: is a directory; give the path of a YAML file") from None
    except OSError as exc:
        raise ConfigError(f"{what} {p}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{what} {p}: larger than {MAX_CONFIG_BYTES // 1024} KiB; a config is a few lines")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {p}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    try:
        data = _BoundedLoader.load(text)
    except _TooBig as exc:
        raise ConfigError(f"{what} {p}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {p}: not valid YAML {yaml_error_summary(exc)}") from None
    except RecursionError:
        raise ConfigError(f"{what} {p}: nested too deeply to be a config") from None
    except (ValueError, TypeError, OverflowError) as exc:  # a value YAML parses but Python refuses: 2001-02-30
        raise ConfigError(f"{what} {p}: a value YAML cannot turn into data ({type(exc).__name__}); quote it"
                          " if it is meant as text") from None
    _check_expanded_size(data, f"{what} {p}")
    return data


class _TooBig(Exception):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that counts nodes and aliases while composing, and stops past the budgets."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise _TooBig(f"more than {MAX_YAML_ALIASES} YAML aliases (*name); write the values out")
        else:
            self._nodes += 1
            if self._nodes > MAX_YAML_NODES:
                raise _TooBig(f"more than {MAX_YAML_NODES} YAML values; a config is a few lines")
        return super().compose_node(parent, index)

    @classmethod
    def load(cls, text: str) -> Any:
        loader = cls(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()


def _check_expanded_size(data: Any, where: str) -> None:
    """Walk the loaded data counting aliased parts every time they appear; stop past the budget."""
    stack, seen, chars = [data], 0, 0
    while stack:
        item = stack.pop()
        seen += 1
        chars += len(item) if isinstance(item, (str, bytes)) else 0
        if seen > MAX_YAML_EXPANDED or chars > MAX_YAML_EXPANDED_CHARS:
            raise ConfigError(f"{where}: its YAML aliases expand to more than {MAX_YAML_EXPANDED} values or"
                              f" {MAX_YAML_EXPANDED_CHARS // (1024 * 1024)} MiB of text; write the values out"
                              " instead of nesting aliases")
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_TOKEN_NAME = re.compile(r"^'<[a-z ]+>'$")


def yaml_error_summary(exc: yaml.YAMLError) -> str:
    """'at line L, column C: <kind>' of a YAML error, without the text of the file.

    PyYAML's own message quotes the offending line (it may be a password); its `problem` can quote a
    piece of it too, so every quoted fragment is dropped except PyYAML's token names like '<scalar>'."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    kind = getattr(exc, "problem", None) or getattr(exc, "reason", None) or type(exc).__name__
    kind = _QUOTED.sub(lambda m: m.group(0) if _TOKEN_NAME.match(m.group(0)) else "(...)", str(kind))
    if mark is not None:
        return f"at line {mark.line + 1}, column {mark.column + 1}: {kind}"
    position = getattr(exc, "position", None)
    return f"at character {position}: {kind}" if position is not None else f"({kind})"


def load_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The settings in a YAML config file (a mapping), or ConfigError."""
    data = read_yaml(path, "config file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping of settings")
    _check_keys(data, f"config file {path}")
    return data


def _check_keys(data: Any, where: str) -> None:
    """Every mapping key in the file must be text: YAML reads `1:`, `on:` or `2024-01-01:` as a number, a
    bool or a date, which no setting is called and which a later join or lookup would trip over."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if not isinstance(key, str):
                    raise ConfigError(f"{where}: the key {key!r} ({type(key).__name__}) is not a setting name;"
                                      " keys are text (quote it if it is meant as text)")
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)


def env_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """ROOFLIGHT_ENGINE_URL (comma-separated), ROOFLIGHT_MODEL, ROOFLIGHT_INTERVAL, ...

    Other ROOFLIGHT_* variables are not settings: Kubernetes injects ROOFLIGHT_PORT,
    ROOFLIGHT_SERVICE_HOST, ... into every pod of a namespace with a Service named `rooflight`. They are
    left alone, and a name that looks like a misspelt setting is logged, not fatal.
    """
    out: dict[str, Any] = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX) or value == "":
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name in ENV_KEYS:
            out[name] = value
        elif not _SERVICE_LINK.match(name):
            logging.getLogger("rooflight").warning("ignoring %s: not a setting (see `rooflight run --help`)", key)
    if "engine_url" in out:
        out["engine_url"] = [u.strip() for u in out["engine_url"].split(",") if u.strip()]
    return out


_TARGET_KEYS = {f.name for f in fields(TargetConfig)}
_SERVICE_LINK = re.compile(r"^(?:.*_)?(?:service_host|service_port.*|port|port_\d+_.*)$")
_AGENT_KEYS = {"listen", "interval", "scrape_timeout", "max_body_bytes", "max_series", "windows", "percentiles", "nvml",
               "nvml_interval", "gpus", "process", "web_config", "detectors", "read_header_timeout", "max_connections"}
# The proxy's settings: each needs proxy_listen, which turns the proxy on.
PROXY_KEYS = ("proxy_listen", "proxy_upstream", "slo", "tenant_header", "tenant_top", "proxy_buckets")
_AGENT_KEYS |= set(PROXY_KEYS)


ENV_KEYS = (_AGENT_KEYS | _TARGET_KEYS | {"engine_url", "config", "log_level", "target_name"}) - {"url", "name", "detectors"}


# Flags whose file/environment spelling is not the flag's name with dashes as underscores.
_FLAG_SPELLINGS = {"detector": "detectors: {KEY: NUMBER} (ROOFLIGHT_* has no twin: use the file or --detector)",
                   "no_nvml": "nvml: false (ROOFLIGHT_NVML=false)", "no_process": "process: false (ROOFLIGHT_PROCESS=false)",
                   "log_level": "--log-level or ROOFLIGHT_LOG_LEVEL (not a file setting)"}


def build(file_settings: Mapping[str, Any], env: Mapping[str, Any], flags: Mapping[str, Any]) -> AgentConfig:
    """Merge the three layers (flags win) and validate."""
    merged: dict[str, Any] = {}
    for layer in (file_settings, env, flags):
        _check_names(layer)
        merged.update({k: v for k, v in layer.items() if v is not None})
    unknown = set(merged) - _AGENT_KEYS - _TARGET_KEYS - {"targets", "engine_url", "config", "target_name"}
    if unknown:
        hints = "".join(f"; for {k} write {_FLAG_SPELLINGS[k]}" for k in sorted(unknown) if k in _FLAG_SPELLINGS)
        raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}{hints}; see `rooflight run --help`")
    shared = {k: merged[k] for k in _TARGET_KEYS - {"url", "name"} if k in merged}
    targets = _targets(merged, shared)
    config = AgentConfig(
        targets=targets,
        listen=str(merged.get("listen", DEFAULT_LISTEN)),
        interval=parse_duration(merged.get("interval", 1.0), "interval"),
        scrape_timeout=parse_duration(merged.get("scrape_timeout", 5.0), "scrape_timeout"),
        max_body_bytes=_positive_int(merged.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES), "max_body_bytes"),
        max_series=_positive_int(merged.get("max_series", 128), "max_series"),
        windows=parse_windows(merged.get("windows", ["10s", "1m", "5m"])),
        percentiles=parse_percentiles(merged.get("percentiles", ["50", "90", "99"])),
        nvml=_bool(merged.get("nvml", True), "nvml"),
        nvml_interval=parse_duration(merged.get("nvml_interval", 1.0), "nvml_interval"),
        gpus=_gpu_scope(merged.get("gpus", "own")),
        process=_bool(merged.get("process", True), "process"),
        web_config=_optional_path(merged.get("web_config"), "web_config"),
        detectors=_detectors(merged.get("detectors")),
        read_header_timeout=parse_duration(merged.get("read_header_timeout", 10.0), "read_header_timeout"),
        max_connections=_positive_int(merged.get("max_connections", 256), "max_connections"),
        **_proxy_settings(merged, targets),
    )
    return validate(config)


def validate(config: AgentConfig) -> AgentConfig:
    split_listen(config.listen)
    if not 0.1 <= config.interval <= 60:
        raise ConfigError(f"interval {config.interval}s: choose between 0.1s and 60s")
    shortest = min(config.windows.values())
    if config.interval > shortest / 2:
        raise ConfigError(
            f"interval {config.interval}s is too coarse for the {shortest:g}s window: a window needs at least"
            " two samples; lower --interval or lengthen --windows"
        )
    if config.scrape_timeout > MAX_SCRAPE_TIMEOUT_SECONDS:
        raise ConfigError(f"scrape_timeout {config.scrape_timeout:g}s: choose at most {MAX_SCRAPE_TIMEOUT_SECONDS:g}s")
    if config.read_header_timeout > 300:
        raise ConfigError(f"read_header_timeout {config.read_header_timeout:g}s: choose at most 300s (default 10s)")
    _check_detectors(config.detectors)
    if config.proxy_listen is not None:
        _check_proxy_listen(config.proxy_listen, config.listen)
    names = [t.name for t in config.targets]
    if len(set(names)) != len(names):
        raise ConfigError(f"two targets share a name: {names}; give each a distinct `name`")
    return config


def _proxy_settings(merged: Mapping[str, Any], targets: tuple[TargetConfig, ...]) -> dict[str, Any]:
    """The proxy's fields of AgentConfig; a proxy setting without proxy_listen is a mistake, not a no-op."""
    listen = merged.get("proxy_listen")
    if listen is None:
        given = [k for k in PROXY_KEYS if merged.get(k) not in (None, [], ())]
        if given:
            raise ConfigError(f"{', '.join(given)} set without proxy_listen: the proxy is off; add --proxy-listen"
                              " HOST:PORT (ROOFLIGHT_PROXY_LISTEN) to run it, or drop the setting")
        return {}
    if not isinstance(listen, str) or not listen.strip():
        raise ConfigError(f"proxy_listen: {listen!r}: write HOST:PORT, e.g. 127.0.0.1:8100")
    return {
        "proxy_listen": listen.strip(),
        "proxy_upstream": _proxy_upstream(merged.get("proxy_upstream"), targets),
        "slo": _spellings(merged.get("slo"), "slo"),
        "tenant_header": None if merged.get("tenant_header") is None else str(merged["tenant_header"]),
        "tenant_top": _whole(merged.get("tenant_top", 10), "tenant_top"),
        "proxy_buckets": _spellings(merged.get("proxy_buckets"), "proxy_buckets"),
    }


def _proxy_upstream(value: Any, targets: tuple[TargetConfig, ...]) -> str:
    """The URL the proxy relays to: as given, else the one engine target's (never its user:password)."""
    if value is not None:
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"proxy_upstream: {value!r}: write the engine's URL, e.g. http://127.0.0.1:8000")
        return value.strip()
    if len(targets) != 1:
        raise ConfigError(f"proxy_listen with {len(targets)} engine targets: say which one the proxy fronts with"
                          " --proxy-upstream URL (ROOFLIGHT_PROXY_UPSTREAM)")
    return public_url(targets[0].url)


def _spellings(value: Any, what: str) -> tuple[str, ...]:
    """SLOs or bucket edges as strings: one, a list, `;`-separated (the environment), or YAML mappings.

    A mapping is written back as the flag spells it: {ttft: 0.5, tpot: 50ms} -> "ttft=0.5,tpot=50ms"."""
    if value is None:
        return ()
    items = value.split(";") if isinstance(value, str) else value
    if isinstance(items, Mapping):
        items = [items]
    if not isinstance(items, (list, tuple)):
        raise ConfigError(f"{what}: write a string, a list of strings or a list of mappings, got {value!r}")
    out = []
    for item in items:
        if isinstance(item, Mapping):
            item = ",".join(f"{k}={v}" for k, v in item.items())
        if not isinstance(item, (str, int, float)) or isinstance(item, bool):
            raise ConfigError(f"{what}: {item!r} is not a spelling like ttft=0.5,tpot=0.05")
        if str(item).strip():
            out.append(str(item).strip())
    return tuple(out)


def _whole(value: Any, what: str) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ConfigError(f"{what}: {value!r} is not a whole number")
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{what}: {value!r} is not a whole number") from None


_WILDCARDS = ("0.0.0.0", "::", "")


def _check_proxy_listen(proxy_listen: str, listen: str) -> None:
    """The proxy passes every path through, so it cannot share the agent's port (its /metrics is the agent's)."""
    try:
        host, port = split_listen(proxy_listen)
    except ConfigError:
        raise ConfigError(f"proxy_listen {proxy_listen!r}: write HOST:PORT, e.g. 127.0.0.1:8100 or 0.0.0.0:8100") from None
    agent_host, agent_port = split_listen(listen)
    if port and port == agent_port and (host == agent_host or host in _WILDCARDS or agent_host in _WILDCARDS):
        raise ConfigError(f"proxy_listen {proxy_listen} and listen {listen} share port {port}: clients reach the"
                          " engine through the proxy's port, /metrics is on the agent's; give each its own")


def _detectors(value: Any) -> dict[str, float]:
    """`detectors:` is a mapping of threshold names to numbers, e.g. {hol_inflation: 4}."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError("detectors: write a mapping of threshold names to numbers, e.g."
                          " `detectors: {hol_inflation: 4}` (or --detector hol_inflation=4)")
    out = {}
    for key, number in value.items():
        try:
            out[str(key)] = _finite(number)
        except (TypeError, ValueError):
            raise ConfigError(f"detectors.{key}: {number!r} is not a number; write e.g. {key}: 4") from None
    return out


def _finite(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError("a bool is not a threshold")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError("not finite")
    return number


def _optional_path(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ConfigError(f"{what}: {value!r} is not a file path; write e.g. {what}: /etc/rooflight/web.yml")
    return str(value)


def _check_detectors(thresholds: Mapping[str, float]) -> None:
    from rooflight.agent.signals.detectors import DetectorThresholds

    known = set(DetectorThresholds.__dataclass_fields__)
    unknown = set(thresholds) - known
    if unknown:
        raise ConfigError(f"unknown detector threshold(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    DetectorThresholds(**thresholds)  # its own checks raise ConfigError with the reason


def _check_names(settings: Any, where: str = "") -> None:
    """Every setting name is text: a YAML key like `1:` or `null:` is a ConfigError, not a TypeError later."""
    if not isinstance(settings, Mapping):
        raise ConfigError(f"{where or 'the settings'}: must be a mapping of setting names to values")
    odd = sorted({type(k).__name__ for k in settings if not isinstance(k, str)})
    if odd:
        raise ConfigError(f"{where or 'the settings'}: a setting name must be text, not {', '.join(odd)};"
                          " check the config file's indentation and keys")


def _shape(entry: Any) -> str:
    """What a bad `targets` entry is, without its values (a URL there may carry a password or a token)."""
    if isinstance(entry, Mapping):
        keys = ", ".join(sorted(repr(k)[:40] for k in entry)[:10])
        return f"a mapping with keys {keys}" if keys else "an empty mapping"
    return f"a {type(entry).__name__}"


def _targets(merged: Mapping[str, Any], shared: Mapping[str, Any]) -> tuple[TargetConfig, ...]:
    entries: list[Mapping[str, Any]] = []
    listed = merged.get("targets") or []
    if not isinstance(listed, (list, tuple)):
        raise ConfigError("`targets` must be a list of mappings, each with a `url`")
    for entry in listed:
        if not isinstance(entry, Mapping) or "url" not in entry:
            raise ConfigError(f"each entry of `targets` needs a `url`, got {_shape(entry)}")
        entries.append(entry)
    urls = merged.get("engine_url") or []
    if not isinstance(urls, (str, list, tuple)) or not all(isinstance(u, str) for u in ([urls] if isinstance(urls, str) else urls)):
        raise ConfigError("engine_url: write a URL or a list of URLs, e.g. http://127.0.0.1:8000")
    entries += [{"url": u} for u in ([urls] if isinstance(urls, str) else urls)]
    if not entries:
        raise ConfigError("no engine to watch: pass --engine-url URL (or try `rooflight demo`)")
    if merged.get("target_name") is not None:
        entries = _named_single_target(entries, merged["target_name"])
    return tuple(_target(entry, shared) for entry in entries)


MAX_TARGET_NAME = 253  # a Kubernetes pod name's limit: the shipped manifests pass the pod's name


def _named_single_target(entries: list[Mapping[str, Any]], name: Any) -> list[Mapping[str, Any]]:
    """`target_name` (ROOFLIGHT_TARGET_NAME, --target-name) names the one engine a sidecar watches."""
    if len(entries) != 1:
        raise ConfigError("target_name names the one engine target; with several, give each a `name` in the"
                          " config file's `targets:` list")
    text = name if isinstance(name, str) else None
    if not text or len(text) > MAX_TARGET_NAME or not text.isprintable() or text != text.strip():
        raise ConfigError(f"target_name: write a non-empty name of at most {MAX_TARGET_NAME} printable characters"
                          " without surrounding spaces (e.g. the pod's name)")
    return [{**entries[0], "name": text}]


def _target(entry: Mapping[str, Any], shared: Mapping[str, Any]) -> TargetConfig:
    values = {**shared, **entry}
    url = str(values["url"]).rstrip("/")
    check_engine_url(url)
    shown = public_url(url)
    unknown = set(entry) - _TARGET_KEYS
    if unknown:
        raise ConfigError(f"target {shown}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    if values.get("model") and values.get("model_config"):
        raise ConfigError(f"target {shown}: give --model or --model-config, not both")
    name = str(values.get("name") or target_name(url))
    if len(name) > MAX_TARGET_NAME or not name.isprintable() or name != name.strip():
        # the name is a label value and is printed in every log line of the target: no control characters
        raise ConfigError(f"target {shown}: `name` must be at most {MAX_TARGET_NAME} printable characters without "
                          "surrounding spaces (got " + ascii(name)[:80] + ")")
    target = TargetConfig(url=url, name=name)
    if values.get("draft_model") and values.get("draft_model_config"):
        raise ConfigError(f"target {shown}: give --draft-model or --draft-model-config, not both")
    for key in ("engine", "metrics_path", "model", "model_config", "weight_dtype", "kv_dtype", "gpu",
                "draft_model", "draft_model_config"):
        if values.get(key) is not None:
            target = replace(target, **{key: str(values[key])})
    _check_engine(target)
    for key in ("tp", "batch_max", "pid", "ep"):
        if values.get(key) is not None:
            target = replace(target, **{key: _positive_int(values[key], key)})
    return _signal_settings(target, values)


ROLES = ("both", "prefill", "decode")  # as agent/signals/headroom.py names them


def _signal_settings(target: TargetConfig, values: Mapping[str, Any]) -> TargetConfig:
    """role, the SLO thresholds (durations) and gpu_hour_cost (a price above 0) of one target."""
    role = values.get("role")
    if role is not None:
        if str(role).strip().lower() not in ROLES:
            raise ConfigError(f"role {role!r}: choose one of {', '.join(ROLES)} (a disaggregated pool's part)")
        target = replace(target, role=str(role).strip().lower())
    for key in ("ttft_slo", "itl_slo"):
        if values.get(key) is not None:
            target = replace(target, **{key: parse_duration(values[key], key)})
    cost = values.get("gpu_hour_cost")
    if cost is not None:
        try:
            price = _finite(cost)
        except (TypeError, ValueError):
            raise ConfigError(f"gpu_hour_cost: {cost!r} is not a number; write the price of one GPU-hour, e.g. 2.5") from None
        if price <= 0:
            raise ConfigError(f"gpu_hour_cost: must be above 0, got {cost!r}")
        target = replace(target, gpu_hour_cost=price)
    return target


def _check_engine(target: TargetConfig) -> None:
    from rooflight.collectors.engines import names

    if target.engine != "auto" and target.engine not in names():
        raise ConfigError(f"target {public_url(target.url)}: engine {target.engine!r} is not one of auto,"
                          f" {', '.join(names())}")


def _positive_int(value: Any, what: str) -> int:
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(value)
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{what}: {value!r} is not a whole number") from None
    if number < 1:
        raise ConfigError(f"{what}: must be at least 1, got {number}")
    return number


GPU_SCOPES = ("own", "all")


def _gpu_scope(value: Any) -> str:
    """`gpus`: own (each sidecar its engine's GPUs) or all (every GPU the agent sees: a node-level agent)."""
    scope = value.strip().lower() if isinstance(value, str) else value
    if scope not in GPU_SCOPES:
        raise ConfigError(f"gpus: {value!r}: write own (the GPUs of the targets' engines, the default) "
                          "or all (every GPU on the node)")
    return str(scope)


def _bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{what}: {value!r} is not true or false")


def _items(value: Any, what: str) -> list[Any]:
    """A comma-separated string or a list, as the flags and the YAML file spell lists."""
    if isinstance(value, str):
        return value.split(",")
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ConfigError(f"{what}: write a comma-separated list or a YAML list, got {value!r}")


def parse_windows(value: Any, what: str = "windows") -> dict[str, float]:
    """`10s,1m,5m` (or a YAML list): each window's name and its seconds."""
    items = _items(value, what)
    windows = {str(w).strip(): parse_duration(str(w).strip(), what) for w in items if str(w).strip()}
    if not windows:
        raise ConfigError(f"{what}: give at least one, e.g. 10s,1m,5m")
    return windows


def parse_percentiles(value: Any, what: str = "percentiles", required: bool = False) -> tuple[str, ...]:
    """`50,90,99` (or a YAML list): each percentile as its label value, once."""
    out = []
    for item in _items(value, what):
        text = str(item).strip()
        if not text:
            continue
        try:
            number = float(text)
        except ValueError:
            raise ConfigError(f"{what}: {text!r} is not a number between 0 and 100") from None
        if not 0 < number < 100:
            raise ConfigError(f"{what}: {text} must be between 0 and 100 (exclusive)")
        out.append(f"{number:g}")
    if required and not out:
        raise ConfigError(f"{what}: give at least one, e.g. 50,90,99")
    return tuple(dict.fromkeys(out))
