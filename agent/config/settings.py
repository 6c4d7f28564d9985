"""Every setting of every command (`rooflight run`, `proxy`, `demo`, `plan` and `rules`), declared once.

A Setting names its key (the config file's key, ROOFLIGHT_<KEY> and the parsed flag's attribute), the
commands that offer it and its flag in each, its --help line, its default and the parser that checks it
(agent/config/values.py; each raises ConfigError saying what to fix, and the CLI exits 2). The
commands' parsers (add_flags), the flags' values (flag_values), the environment's names and the file's
keys are all read from here: tests/agent/config/test_declared_settings.py fails when a flag is declared elsewhere.

A setting two commands share (the proxy's SLOs, tenants and buckets, in `rooflight run --proxy-listen`
and in `rooflight proxy`; the model, its dtypes, the GPU, TP, batch cap and SLOs of `run` and `plan`) is
one Setting; a flag spelt alike in two commands but meaning something else there (`--listen`: the agent's
/metrics, or where the proxy's clients connect) is one per command. `plan`'s own and `rules`' are in
plan_settings.py and rules_settings.py, joined here.
"""

from __future__ import annotations

import argparse
import re
from typing import Any, Callable, Mapping

from rooflight.agent.config import plan_settings, rules_settings
from rooflight.agent.config import values as v
from rooflight.agent.config.setting import (  # noqa: F401 - the commands and the type, read from here
    COMMANDS, DEMO, ENV_PREFIX, PLAN, PROXY, RULES, RUN, SECTIONED, Setting, text,
)
from rooflight.agent.config.urls import parse_upstream
from rooflight.collectors.common import DEFAULT_MAX_BODY_BYTES, MAX_BATCH, MAX_TENSOR_PARALLEL

DEFAULT_LISTEN = "127.0.0.1:9746"  # the agent's /metrics
PROXY_LISTEN = "127.0.0.1:8100"  # where the proxy's clients connect (not 8000, the engines' default, nor 8080, llama.cpp's)
PROXY_METRICS_LISTEN = "127.0.0.1:9748"  # the proxy's own /metrics, next to the agent's 9746
LOG_LEVELS = ("debug", "info", "warning", "error")

# --help sections of `rooflight run` and `rooflight plan` (the other commands have one section)
CAPACITY = "capacity signals (docs/metrics.md, section Capacity, cost and energy)"
CLIENT = "client-side proxy (docs/proxy.md)"
_text = text

_OWN: tuple[Setting, ...] = (
    # `rooflight run`: where the settings come from, and which engines
    # ROOFLIGHT_CONFIG names the file too; a `config:` key in the file itself is accepted and ignored
    Setting("config", "YAML file with these settings (flags override it)", metavar="FILE"),
    Setting("engine_url", "engine API base, e.g. http://127.0.0.1:8000 (repeat for several engines)", metavar="URL",
            action="append"),
    Setting("engine", "engine kind; default auto (recognised from its /metrics)", metavar="NAME", target=True,
            parse=_text, default="auto"),
    Setting("metrics_path", "override the engine's metrics path", metavar="PATH", target=True, parse=_text),
    Setting("target_name", "the engine's `target` label (default host:port; in Kubernetes, the pod's name)",
            metavar="NAME"),
    Setting("model", "model preset (see `rooflight plan --list`)", metavar="PRESET", exclusive="model", target=True,
            parse=_text,
            commands=(RUN, PLAN), per={PLAN: plan_settings.SHARED["model"]}),
    Setting("model_config", "a Hugging Face config.json for the served model", metavar="PATH", exclusive="model",
            target=True, parse=_text,
            commands=(RUN, PLAN), per={PLAN: plan_settings.SHARED["model_config"]}),
    Setting("weight_dtype", "bf16, fp16, fp8, int8 or int4 (default: from config)", metavar="DTYPE", target=True,
            parse=v.dtype,
            commands=(RUN, PLAN), per={PLAN: plan_settings.SHARED["weight_dtype"]}),
    Setting("kv_dtype", "KV-cache dtype; fp8 halves KV bytes (default: weights')", metavar="DTYPE", target=True,
            parse=v.dtype,
            commands=(RUN, PLAN), per={PLAN: plan_settings.SHARED["kv_dtype"]}),
    Setting("gpu", "GPU constants profile, e.g. h100-sxm (default: the NVML name's, none for a GPU without "
            "constants: its MBU/MFU stay absent; h100-sxm where no GPU is seen)", metavar="PROFILE", target=True,
            parse=_text,
            commands=(RUN, PLAN), per={PLAN: plan_settings.SHARED["gpu"]}),
    Setting("tp", "tensor-parallel size: GPUs one model copy spans (default: what the engine says, else the GPUs"
            " its processes use / its data-parallel ranks, else 1; the engine wins over this)", metavar="N", type=int,
            target=True, parse=v.count_within(MAX_TENSOR_PARALLEL, "write the GPUs one model copy spans (an NVL72"
                                              " rack is 72)"),
            commands=(RUN, PLAN), per={PLAN: plan_settings.SHARED["tp"]}),
    Setting("ep", "expert-parallel size of a MoE engine (vLLM --enable-expert-parallel: data-parallel x"
            " tensor-parallel size): each copy holds 1/(ep/tp) of the routed experts (default: 1)", metavar="N",
            type=int, target=True, parse=v.count_within(v.MAX_EXPERT_PARALLEL, "write the GPUs the routed experts"
                                                        " are spread over (data-parallel x tensor-parallel size)"),
            commands=(RUN, PLAN), per={PLAN: plan_settings.SHARED["ep"]}),
    Setting("draft_model", "speculative decoding's draft model (a preset or Hugging Face id): its weights join MBU"
            " once per draft token a step", metavar="PRESET", target=True, parse=_text,
            commands=(RUN, PLAN), per={PLAN: plan_settings.SHARED["draft_model"]}),
    Setting("draft_model_config", "the draft model's config.json (instead of --draft-model)", metavar="PATH",
            target=True, parse=_text,
            commands=(RUN, PLAN), per={PLAN: plan_settings.SHARED["draft_model_config"]}),
    Setting("batch_max", "the engine's batch cap (vLLM max_num_seqs) where /metrics lacks it", metavar="N", type=int,
            target=True, parse=v.count_within(MAX_BATCH, "write the engine's batch cap (vLLM max_num_seqs: 256 to a"
                                              " few thousand)"),
            commands=(RUN, PLAN), per={PLAN: plan_settings.SHARED["batch_max"]}),
    Setting("pid", "the engine's PID, for its CPU and memory (default: found by the URL's port)", type=int,
            target=True, parse=v.count_within(v.MAX_PID, "write the engine's process id")),
    # `rooflight run`: the agent
    Setting("listen", f"where to serve /metrics (default {DEFAULT_LISTEN})", metavar="HOST:PORT", parse=_text,
            default=DEFAULT_LISTEN),
    Setting("interval", "sampling interval, 0.1s to 60s (default 1s)", metavar="SECONDS", parse=v.parse_duration,
            default=1.0),
    Setting("scrape_timeout", "engine scrape timeout (default 5s; vLLM can take seconds under load)",
            metavar="SECONDS", parse=v.parse_duration, default=5.0),
    Setting("max_body_bytes", flagged=False, parse=v.count_within(v.MAX_BODY_BYTES, "write the largest engine page"
                                                                   " to read, in bytes (default 4 MiB)"),
            default=DEFAULT_MAX_BODY_BYTES),  # sized: docs/reliability.md
    Setting("max_series", flagged=False, parse=v.count_within(v.MAX_SERIES, "write the (model, rank) series to"
                                                               " keep per target (default 128)"), default=128),  # (model, rank) series kept per target
    Setting("windows", "window lengths (default 10s,1m,5m)", metavar="LIST", parse=v.parse_windows,
            default=("10s", "1m", "5m")),
    Setting("percentiles", "TTFT/ITL percentiles (default 50,90,99)", metavar="LIST", parse=v.parse_percentiles,
            default=("50", "90", "99")),
    Setting("nvml", "do not read NVML", flags={RUN: "--no-nvml"}, action="store_false", parse=v.parse_bool,
            default=True, hint="nvml: false (ROOFLIGHT_NVML=false)"),
    Setting("nvml_interval", flagged=False, parse=v.parse_duration, default=1.0),
    Setting("gpus", "GPUs to export: own (the engines' GPUs, found from NVML's processes; default) or all (every"
            " GPU on the node: a node-level agent)", choices=v.GPU_SCOPES, parse=v.gpu_scope, default="own"),
    Setting("process", "do not read the engine process", flags={RUN: "--no-process"}, action="store_false",
            parse=v.parse_bool, default=True, hint="process: false (ROOFLIGHT_PROCESS=false)"),
    Setting("web_config", "TLS and basic auth, exporter-toolkit web-config.yml format", metavar="FILE",
            parse=v.optional_path),
    Setting("read_header_timeout", "close a connection that has not sent a request's headers within this"
            " (default 10s)", metavar="SECONDS", parse=v.parse_duration, default=10.0),
    Setting("max_connections", "open connections to the agent at most; more are answered 503 (default 256)",
            metavar="N", type=int, parse=v.count_within(v.MAX_CONNECTIONS, "write the open connections to allow"
                                                        " (default 256)"), default=256),
    Setting("detectors", "a detector threshold, e.g. hol_inflation=4", flags={RUN: "--detector", DEMO: "--detector"},
            commands=(RUN, DEMO), metavar="KEY=VALUE",
            action="append", env=False, parse=v.detector_thresholds,
            hint="detectors: {KEY: NUMBER} (ROOFLIGHT_* has no twin: use the file or --detector)"),
    # `rooflight run`: capacity signals of each target
    Setting("canary", "send a 1-token request to an engine the stall detector calls stalled: unanswered, the hang"
            " is confirmed (RooflightEngineStalled pages); answered, it was stuck gauges (default: off)",
            commands=(RUN, DEMO), action="store_true", parse=v.parse_bool, default=False,
            hint="canary: true (ROOFLIGHT_CANARY=true)"),
    Setting("role", "the engine's part in disaggregated serving (default: its config's, else both)",
            choices=v.ROLES, group=CAPACITY, target=True, parse=v.role),
    Setting("ttft_slo", "TTFT SLO for rooflight_headroom_ratio{resource=\"ttft_slo\"}", metavar="SECONDS",
            group=CAPACITY, target=True, parse=v.parse_duration,
            commands=(RUN, PLAN), per={PLAN: plan_settings.SHARED["ttft_slo"]}),
    Setting("itl_slo", "ITL SLO for rooflight_headroom_ratio{resource=\"itl_slo\"}", metavar="SECONDS",
            group=CAPACITY, target=True, parse=v.parse_duration,
            commands=(RUN, PLAN), per={PLAN: plan_settings.SHARED["itl_slo"]}),
    Setting("gpu_hour_cost", "price of one GPU-hour, any currency: gives rooflight_cost_per_million_tokens",
            metavar="PRICE", type=float, group=CAPACITY, target=True, parse=v.gpu_hour_cost, commands=(RUN, DEMO)),
    # `rooflight run --proxy-listen`: the proxy beside the agent (its relay a child process)
    Setting("proxy_listen", "run the proxy here, e.g. 0.0.0.0:8100: clients connect to it, its rooflight_client_*"
            " metrics join this /metrics (default: off)", metavar="HOST:PORT", group=CLIENT, proxy=True),
    Setting("proxy_upstream", "the OpenAI-compatible server the proxy relays to (default: the one --engine-url)",
            metavar="URL", group=CLIENT, proxy=True),
    # `rooflight proxy`: the proxy on its own
    Setting("upstream", "the OpenAI-compatible server, e.g. http://127.0.0.1:8000 (required)", metavar="URL",
            commands=(PROXY,), env=False, file=False, parse=parse_upstream),
    Setting("listen", f"where clients connect (default {PROXY_LISTEN})", metavar="HOST:PORT", commands=(PROXY,),
            env=False, file=False, default=PROXY_LISTEN),
    Setting("metrics_listen", f"where to serve /metrics, a port of its own (default {PROXY_METRICS_LISTEN})",
            metavar="HOST:PORT", commands=(PROXY,), env=False, file=False, default=PROXY_METRICS_LISTEN),
    # both: the proxy's SLOs, tenants and histogram edges
    Setting("slo", "a joint SLO for goodput, keys ttft, itl, tpot, e2e, e.g. ttft=0.5,tpot=0.05 (repeatable)",
            metavar="KEY=SECONDS,...", commands=(RUN, PROXY), group=CLIENT, action="append", proxy=True),
    Setting("tenant_header", "attribute requests to tenants by this header (hashed)", metavar="NAME",
            commands=(RUN, PROXY), group=CLIENT, proxy=True, parse=v.header_name),
    Setting("tenant_top", "tenants named in labels; the rest are `other` (default 10)", metavar="N",
            commands=(RUN, PROXY), group=CLIENT, proxy=True, parse=v.label_count, default=10),
    Setting("proxy_buckets", "client histogram edges in seconds for ttft, itl, tpot or e2e (repeatable); SLO"
            " targets are added", flags={PROXY: "--buckets"}, metavar="NAME=EDGE,...", commands=(RUN, PROXY),
            group=CLIENT, action="append", proxy=True),
    # `rooflight proxy`: its port and upstream
    Setting("windows", "percentile and goodput windows (default 10s,1m,5m)", metavar="LIST", commands=(PROXY,),
            env=False, file=False, parse=v.parse_windows, default="10s,1m,5m"),
    Setting("percentiles", "exported percentiles (default 50,90,99)", metavar="LIST", commands=(PROXY,), env=False,
            file=False, parse=v.required_percentiles, default="50,90,99"),
    Setting("connect_timeout", "upstream connect timeout (default 10s); no read timeout", metavar="SECONDS",
            commands=(PROXY,), env=False, file=False, parse=v.parse_duration, default="10s"),
    Setting("read_header_timeout", "a request's headers must arrive within this of its first byte (default 10s)",
            metavar="SECONDS", commands=(PROXY,), env=False, file=False, parse=v.port_timeout, default="10s"),
    Setting("read_body_timeout", "close a connection whose request body is not in after this long of waiting for it, all pauses together (default 10s)",
            metavar="SECONDS", commands=(PROXY,), env=False, file=False, parse=v.port_timeout, default="10s"),
    Setting("idle_timeout", "close a keep-alive connection idle this long (default 60s)", metavar="SECONDS",
            commands=(PROXY,), env=False, file=False, parse=v.port_timeout, default="60s"),
    Setting("max_connections", "connections open on --listen at once (default 4096)", metavar="N",
            commands=(PROXY,), env=False, file=False, parse=v.connection_cap, default=4096),
    # checked against --max-connections, its default half of it: agent/proxy/config.py
    Setting("max_connections_per_client", "of them, held by one IP address (default half of --max-connections)",
            metavar="N", commands=(PROXY,), env=False, file=False),
    Setting("request_log", "append one JSON line per finished request to this file: its times, tokens and outcome,"
            " never its content (default: off)", metavar="FILE", commands=(PROXY,), env=False, file=False,
            parse=v.log_file),
    Setting("upstream_credentials_for_anonymous", "add --upstream's user:password to requests that carry no"
            " Authorization of their own (anyone who reaches --listen is lent them); without it a user:password is"
            " refused", commands=(PROXY,), action="store_true", flag_default=False, env=False, file=False),
    # `rooflight demo`
    Setting("scenario", "steady, head-of-line, kv-wall, queue or idle", commands=(DEMO,), flag_default="steady",
            env=False, file=False),
    Setting("listen", "the agent's /metrics", metavar="HOST:PORT", commands=(DEMO,), flag_default=DEFAULT_LISTEN,
            env=False, file=False),
    Setting("target_name", "the simulated engine's `target` label (default host:port)", metavar="NAME",
            commands=(DEMO,), env=False, file=False),
    Setting("engine_listen", "the simulated engine's address (default: a free port on 127.0.0.1)",
            metavar="HOST:PORT", commands=(DEMO,), flag_default="127.0.0.1:0", env=False, file=False),
    Setting("interval", "the agent's sampling interval", commands=(DEMO,), flag_default="1s", env=False, file=False),
    Setting("duration", "stop after this long", metavar="SECONDS", commands=(DEMO,), type=float, env=False,
            file=False),
    Setting("seed", "random seed of the simulated traffic", commands=(DEMO,), type=int, flag_default=0, env=False,
            file=False),
    Setting("max_num_seqs", "the simulated engine's batch cap (default 256; 16 in the queue scenario)", metavar="N",
            commands=(DEMO,), type=int, env=False, file=False),
    Setting("chunked_prefill", "split long prompts into chunks (smooths ITL)", commands=(DEMO,), action="store_true",
            flag_default=False, env=False, file=False),
    Setting("fault", "fail the simulated engine on a schedule: KIND@START[:FOR], KIND one of hang, stuck-gauges, 503,"
            " down, gpu-lost, or crash-loop@START:DOWN:UP, or 5xx@START:SHARE (repeatable; agent/demo/faults.py)", metavar="SPEC",
            commands=(DEMO,), action="append", env=False, file=False),
    Setting("time_scale", "simulated seconds per real second (rates then read in simulated time / X)", metavar="X",
            commands=(DEMO,), type=float, flag_default=1.0, env=False, file=False),
    # every command
    Setting("workers", "relay processes behind --listen, one /metrics; one that dies or hangs is replaced (default 1)", metavar="N",
            commands=(PROXY,), env=False, file=False),
    Setting("check_only", "validate the configuration and exit", commands=(RUN, PROXY), action="store_true",
            flag_default=False, env=False, file=False),
    Setting("log_level", "debug, info, warning or error (default: ROOFLIGHT_LOG_LEVEL, else info)",
            choices=LOG_LEVELS, file=False, hint="--log-level or ROOFLIGHT_LOG_LEVEL (not a file setting)"),
    Setting("log_level", "debug, info, warning or error (default info)", commands=(PROXY, DEMO), choices=LOG_LEVELS,
            flag_default="info", env=False, file=False),
)
# every command's, `rooflight plan`'s and `rooflight rules`' own last
SETTINGS: tuple[Setting, ...] = (*_OWN, *plan_settings.SETTINGS, *rules_settings.SETTINGS)


def offered(command: str) -> tuple[Setting, ...]:
    """The settings `rooflight COMMAND` takes as flags, in --help's order, as that command reads them: in
    declaration order, but a shared one where its command says it goes (`after`)."""
    chosen = [s.for_command(command) for s in SETTINGS if command in s.commands and s.flagged]
    order = [s for s in chosen if s.after is None]
    moved = [s for s in chosen if s.after is not None]
    while moved:
        keys = [s.key for s in order]
        ready = next((s for s in moved if s.after == "" or s.after in keys), None)
        if ready is None:
            raise ValueError(f"{command}: {', '.join(s.key for s in moved)} follow flags it does not offer")
        order.insert(0 if ready.after == "" else keys.index(ready.after) + 1, ready)
        moved.remove(ready)
    return tuple(order)


def add_flags(parser: argparse.ArgumentParser, command: str, defaults: Mapping[str, Any] | None = None) -> None:
    """Declare `command`'s flags on its parser, each from its Setting; `defaults` (by key) are the command's
    own where its config holds them (`rooflight rules`: the rules' RulesConfig)."""
    groups: dict[str | None, Any] = {None: parser}
    exclusive: dict[str, Any] = {}
    for s in offered(command):
        group = s.group if command in SECTIONED else None
        if group not in groups:
            groups[group] = parser.add_argument_group(group)
        where = groups[group]
        if s.exclusive:
            if s.exclusive not in exclusive:
                exclusive[s.exclusive] = where.add_mutually_exclusive_group()
            where = exclusive[s.exclusive]
        default = defaults[s.key] if defaults is not None and s.key in defaults else s.flag_default
        kwargs: dict[str, Any] = {"dest": s.key, "help": s.help, "default": default}
        if s.action == "store_false":
            kwargs.update(action="store_const", const=False)
        elif s.action:
            kwargs["action"] = s.action
        for name in ("metavar", "type", "choices"):
            if getattr(s, name) is not None:
                kwargs[name] = list(s.choices) if name == "choices" else getattr(s, name)
        if s.type in (int, float):
            kwargs["type"] = _plainly_written(s.type)
        where.add_argument(*((s.short,) if s.short else ()), s.flag(command), **kwargs)


def _plainly_written(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """int or float of a flag's text, refusing what they read surprisingly (--tp 1_0 as 10): argparse says
    "invalid int value", exit 2."""

    def parse(text: str) -> Any:
        return kind(v.written_number(text))

    parse.__name__ = kind.__name__  # argparse names the type by it
    return parse


def flag_values(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The settings given on the command line: a repeatable flag's list replaces the file's and environment's."""
    out = {}
    for s in offered(command):
        value = getattr(args, s.key, None)
        if value is None or (s.action == "append" and not value):
            continue
        out[s.key] = value
    return out


def _run(predicate: Callable[[Setting], bool]) -> tuple[Setting, ...]:
    return tuple(s for s in SETTINGS if RUN in s.commands and predicate(s))


# `rooflight run`'s settings as its three layers (flags, environment, config file) name them
# one value for the whole agent (config, engine_url, target_name and log_level have no `parse`: read where used)
AGENT = _run(lambda s: s.parse is not None and not s.target and not s.proxy)
TARGET = _run(lambda s: s.target)  # each engine target's, shared by all unless a `targets:` entry says otherwise
PROXY_KEYS = tuple(s.key for s in _run(lambda s: s.proxy))  # each needs proxy_listen, which turns the proxy on
TARGET_KEYS = {"url", "name"} | {s.key for s in TARGET}  # the keys of a `targets:` entry
FILE_KEYS = {"targets"} | {s.key for s in _run(lambda s: s.file)} | TARGET_KEYS  # top-level url and name: ignored
ENV_KEYS = {s.key for s in _run(lambda s: s.env)}
# A flag whose file and environment spelling is not the flag's name with dashes as underscores -> that spelling
FLAG_SPELLINGS = {re.sub("^--", "", s.flag(RUN)).replace("-", "_"): s.hint for s in _run(lambda s: s.hint is not None)}
