"""`rooflight run`'s configuration: flags over environment variables over a YAML file over defaults.

Each setting is declared once in agent/config/settings.py (flag, ROOFLIGHT_ variable, file key, default,
parser). Everything is validated here, once, at start: a bad value raises ConfigError with what to fix,
and the CLI turns that into exit code 2. What the rest of the agent sees is frozen.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from rooflight.agent.config import settings as st
from rooflight.agent.config.urls import check_engine_url, public_url, target_name
from rooflight.agent.config.values import listens_clash, spellings, split_listen, whole
from rooflight.agent.config.yamlfile import read_yaml
from rooflight.agent.errors import ConfigError

MAX_SCRAPE_TIMEOUT_SECONDS = 300.0
ENV_KEYS = st.ENV_KEYS  # ROOFLIGHT_<KEY>, lower-cased


@dataclass(frozen=True, slots=True)
class TargetConfig:
    """One engine endpoint and what the agent must know about the model behind it (defaults: settings.py)."""

    url: str
    name: str
    engine: str
    metrics_path: str | None
    model: str | None  # a preset name
    model_config: str | None  # path to a Hugging Face config.json
    weight_dtype: str | None
    kv_dtype: str | None
    gpu: str | None  # a GPU profile key; None = from NVML (a GPU with no profile: none), else h100-sxm
    tp: int | None  # where the engine does not say; None = NVML's GPUs / DP ranks, else 1
    ep: int | None  # expert-parallel size: GPUs the routed experts are spread over (DP+EP MoE)
    draft_model: str | None  # speculative decoding's draft model: a preset or a Hugging Face id
    draft_model_config: str | None  # ... or its config.json
    batch_max: int | None  # the engine's batch cap where its /metrics does not say
    pid: int | None  # the engine's process, for CPU/RSS (else found by the URL's port)
    # Capacity signals (agent/signals/headroom.py, docs/metrics.md section Capacity, cost and energy).
    role: str | None  # prefill, decode or both; None = what the engine says, else both
    ttft_slo: float | None  # seconds; gives rooflight_headroom_ratio{resource="ttft_slo"}
    itl_slo: float | None  # seconds; gives rooflight_headroom_ratio{resource="itl_slo"}
    gpu_hour_cost: float | None  # price of one GPU per hour, any currency; gives the cost metrics


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """The agent's settings, checked (defaults and meanings: settings.py)."""

    targets: tuple[TargetConfig, ...]
    listen: str
    interval: float
    scrape_timeout: float
    max_body_bytes: int
    max_series: int  # (model, rank) series kept per target; more are dropped and counted
    windows: Mapping[str, float]
    percentiles: tuple[str, ...]
    nvml: bool
    nvml_interval: float
    gpus: str  # GPUs exported: "own" (the targets' engines', docs/metrics.md) or "all" (a node-level agent)
    process: bool
    web_config: str | None
    detectors: Mapping[str, float]
    canary: bool  # a 1-token request to an engine the stall detector calls stalled (agent/sampling/canary.py)
    read_header_timeout: float  # a client must send a request's headers within this (slowloris)
    max_connections: int  # open HTTP connections to the agent; more are answered 503 and closed
    # The client-side proxy (`rooflight proxy` in the same process, docs/proxy.md): on when proxy_listen
    # is set. Its SLO and bucket spellings are parsed by agent/proxy/config.py, with `rooflight proxy`'s messages.
    proxy_listen: str | None
    proxy_upstream: str | None  # resolved here: default the one target's URL (without user:password)
    slo: tuple[str, ...]  # joint SLOs as written, e.g. ("ttft=0.5,tpot=0.05",)
    tenant_header: str | None
    tenant_top: int
    proxy_buckets: tuple[str, ...]  # histogram edges as written, e.g. ("itl=0.005,0.01",)

    @property
    def listen_host(self) -> str:
        return split_listen(self.listen)[0]

    @property
    def listen_port(self) -> int:
        return split_listen(self.listen)[1]


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
        if not key.startswith(st.ENV_PREFIX) or value == "":
            continue
        name = key[len(st.ENV_PREFIX) :].lower()
        if name in ENV_KEYS:
            out[name] = value
        elif not _SERVICE_LINK.match(name):
            logging.getLogger("rooflight").warning("ignoring %s: not a setting (see `rooflight run --help`)", key)
    if "engine_url" in out:
        out["engine_url"] = [u.strip() for u in out["engine_url"].split(",") if u.strip()]
    return out


_SERVICE_LINK = re.compile(r"^(?:.*_)?(?:service_host|service_port.*|port|port_\d+_.*)$")


def _did_you_mean(key: str, known: Iterable[str]) -> str:
    """`; did you mean interval?` for a misspelt key (intervall), else nothing."""
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


def build(file_settings: Mapping[str, Any], env: Mapping[str, Any], flags: Mapping[str, Any]) -> AgentConfig:
    """Merge the three layers (flags win) and validate."""
    merged: dict[str, Any] = {}
    for layer in (file_settings, env, flags):
        _check_names(layer)
        merged.update({k: v for k, v in layer.items() if v is not None})
    unknown = set(merged) - st.FILE_KEYS
    if unknown:
        hints = "".join(f"; for {k} write {st.FLAG_SPELLINGS[k]}" if k in st.FLAG_SPELLINGS else _did_you_mean(k, st.FILE_KEYS)
                        for k in sorted(unknown))
        raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}{hints}; the settings are listed in "
                          "`rooflight run --help` (a file key is the flag's name with _ for -)")
    shared = {s.key: merged[s.key] for s in st.TARGET if s.key in merged}
    targets = _targets(merged, shared)
    config = AgentConfig(
        targets=targets,
        **{s.key: s.parse(merged.get(s.key, s.default), s.key) for s in _AGENT_ORDER},
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
    off = {"proxy_listen": None, "proxy_upstream": None, "slo": (), "tenant_header": None,
           "tenant_top": _PROXY_DEFAULTS["tenant_top"], "proxy_buckets": ()}
    if listen is None:
        given = [k for k in st.PROXY_KEYS if merged.get(k) not in (None, [], ())]
        if given:
            raise ConfigError(f"{', '.join(given)} set without proxy_listen: the proxy is off; add --proxy-listen"
                              " HOST:PORT (ROOFLIGHT_PROXY_LISTEN) to run it, or drop the setting")
        return off
    if not isinstance(listen, str) or not listen.strip():
        raise ConfigError(f"proxy_listen: {listen!r}: write HOST:PORT, e.g. 127.0.0.1:8100")
    return {
        "proxy_listen": listen.strip(),
        "proxy_upstream": _proxy_upstream(merged.get("proxy_upstream"), targets),
        "slo": spellings(merged.get("slo"), "slo"),
        "tenant_header": None if merged.get("tenant_header") is None else str(merged["tenant_header"]),
        "tenant_top": whole(merged.get("tenant_top", _PROXY_DEFAULTS["tenant_top"]), "tenant_top"),
        "proxy_buckets": spellings(merged.get("proxy_buckets"), "proxy_buckets"),
    }


_PROXY_DEFAULTS = {s.key: s.default for s in st.SETTINGS if s.proxy}
# checked in AgentConfig's order: with two bad settings, the one named is the one it always was
_AGENT_ORDER = sorted(st.AGENT, key=lambda s: AgentConfig.__slots__.index(s.key))


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


def _check_proxy_listen(proxy_listen: str, listen: str) -> None:
    """The proxy passes every path through, so it cannot share the agent's port (its /metrics is the agent's)."""
    try:
        host, port = split_listen(proxy_listen)
    except ConfigError:
        raise ConfigError(f"proxy_listen {proxy_listen!r}: write HOST:PORT, e.g. 127.0.0.1:8100 or 0.0.0.0:8100") from None
    if listens_clash(proxy_listen, listen):
        raise ConfigError(f"proxy_listen {proxy_listen} and listen {listen} share port {port}: clients reach the"
                          " engine through the proxy's port, /metrics is on the agent's; give each its own")


def _check_detectors(thresholds: Mapping[str, float]) -> None:
    from rooflight.agent.signals.detectors import DetectorThresholds, knobs

    known = {k.name for k in knobs()}
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
    unknown = set(entry) - st.TARGET_KEYS
    if unknown:
        hints = "".join(_did_you_mean(str(k), st.TARGET_KEYS) for k in sorted(map(str, unknown)))
        raise ConfigError(f"target {shown}: unknown key(s) {', '.join(sorted(map(str, unknown)))}{hints}; a target "
                          f"takes {', '.join(sorted(st.TARGET_KEYS))}")
    if values.get("model") and values.get("model_config"):
        raise ConfigError(f"target {shown}: give --model or --model-config, not both")
    name = str(values.get("name") or target_name(url))
    if len(name) > MAX_TARGET_NAME or not name.isprintable() or name != name.strip():
        # the name is a label value and is printed in every log line of the target: no control characters
        raise ConfigError(f"target {shown}: `name` must be at most {MAX_TARGET_NAME} printable characters without "
                          "surrounding spaces (got " + ascii(name)[:80] + ")")
    if values.get("draft_model") and values.get("draft_model_config"):
        raise ConfigError(f"target {shown}: give --draft-model or --draft-model-config, not both")
    _check_engine(shown, values.get("engine"))  # named first: a wrong engine explains the rest
    return TargetConfig(url=url, name=name, **{
        s.key: s.default if values.get(s.key) is None else s.parse(values[s.key], s.key) for s in st.TARGET})


def _check_engine(shown: str, engine: Any) -> None:
    from rooflight.collectors.engines import names

    if engine is not None and str(engine) != "auto" and str(engine) not in names():
        raise ConfigError(f"target {shown}: engine {str(engine)!r} is not one of auto, {', '.join(names())}")

