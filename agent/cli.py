"""`rooflight`: run the agent next to an engine, try it on the built-in demo, or do the serving math.

Exit codes: 0 fine, 2 a bad flag, config file or model/GPU constant (the message says what to fix).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any, Mapping, Sequence

from rooflight.agent import __version__
from rooflight.agent.config import agent as cfg
from rooflight.agent.config import settings
from rooflight.agent.config import values as v
from rooflight.agent.errors import ConfigError
from rooflight.collectors.common import MAX_TENSOR_PARALLEL

log = logging.getLogger("rooflight")
LOG_LEVELS = {name: getattr(logging, name.upper()) for name in settings.LOG_LEVELS}

RUN_EPILOG = """\
what you get on /metrics (every name starts with rooflight_):
  decode is judged by MBU (bytes it must stream per second / HBM peak), prefill by MFU (FLOP/s / dense peak),
  tokens/s per phase, TTFT and ITL percentiles over 10s/1m/5m windows, KV occupancy, preemptions, and
  detectors for head-of-line blocking and capacity-capped or admission-bound batches. "GPU util" is exported
  as rooflight_gpu_kernel_residency_ratio, named for what it measures.

the client's view too: --proxy-listen HOST:PORT runs `rooflight proxy` beside it (a child process), in front of
the engine (--proxy-upstream, default the one --engine-url). Clients connect to that port; the same
/metrics then carries rooflight_client_*: TTFT, every inter-token gap, TPOT and end-to-end latency as the
client sees them, and goodput, the share of streamed requests meeting every target of each --slo
(DistServe). The head-of-line detector then judges that engine by the exact gaps between tokens the proxy
relayed, not the engine's ITL buckets (rooflight_head_of_line_source says which judged). --slo,
--tenant-header, --tenant-top and --proxy-buckets need --proxy-listen. See docs/proxy.md.

every flag has an environment twin: --engine-url -> ROOFLIGHT_ENGINE_URL (comma-separated), --gpu ->
ROOFLIGHT_GPU, --interval -> ROOFLIGHT_INTERVAL, --proxy-listen -> ROOFLIGHT_PROXY_LISTEN, --slo ->
ROOFLIGHT_SLO (several separated by `;`), ...; a YAML --config file takes the same names (and a
`targets:` list for per-engine settings). Flags win over the environment, which wins over the file.

examples:
  rooflight run --engine-url http://127.0.0.1:8000 --model llama-3-8b --gpu h100-sxm
  rooflight run --engine-url http://127.0.0.1:8000 --model-config /models/llama/config.json --tp 2
  rooflight run --engine-url http://127.0.0.1:8000 --model llama-3-8b --proxy-listen 0.0.0.0:8100 \\
      --slo ttft=0.5,tpot=0.05 --slo ttft=2,tpot=0.1
  rooflight demo --scenario head-of-line
"""


def _flag_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags; --config, --check-only and --log-level are the command's, not settings."""
    out = settings.flag_values(args, settings.RUN)
    for key in ("config", "check_only", "log_level"):
        out.pop(key, None)
    if "detectors" in out:
        out["detectors"] = v.detector_flags(out["detectors"])
    return out


def load_config(args: argparse.Namespace, environ: dict[str, str] | None = None) -> cfg.AgentConfig:
    env = cfg.env_settings(os.environ if environ is None else environ)
    path = args.config or env.pop("config", None)
    file_settings = cfg.load_file(path) if path else {}
    env.pop("log_level", None)
    return cfg.build(file_settings, env, _flag_settings(args))


def draft_for(target: cfg.TargetConfig) -> Any:
    """The target's speculative-decoding draft model (--draft-model / --draft-model-config), or None."""
    if not (target.draft_model or target.draft_model_config):
        return None
    from rooflight.agent.model_files import resolve_model

    try:
        return resolve_model(target.draft_model, target.draft_model_config, None, None)
    except ConfigError as e:
        raise ConfigError(f"target {target.name}: draft model: {e}") from None


def resolve_models(config: cfg.AgentConfig) -> dict[str, tuple[Any, str | None]]:
    """Load every model given by preset or config.json now, so a bad one stops the start (exit 2)."""
    from rooflight.agent.roofline.gpus import get_profile
    from rooflight.agent.model_files import load_config_json
    from rooflight.agent.roofline.models import preset

    out: dict[str, tuple[Any, str | None]] = {}
    for t in config.targets:
        if t.gpu:
            get_profile(t.gpu)
        draft_for(t)  # a bad draft model stops the start too
        if t.model_config:
            spec = load_config_json(t.model_config, weight_dtype=t.weight_dtype, kv_dtype=t.kv_dtype)
            out[t.name] = (spec, f"config.json:{t.model_config}")
        elif t.model:
            out[t.name] = (preset(t.model).with_dtypes(t.weight_dtype, t.kv_dtype), f"preset:{t.model}")
        else:
            out[t.name] = (None, None)
        _check_parallelism(t, out[t.name][0])
    return out


def _check_parallelism(target: cfg.TargetConfig, model: Any) -> None:
    """tp and ep as the model allows (exit 2, saying what to write): tp splits every layer's attention heads,
    so it divides them; ep spreads the routed experts of a MoE model in groups of ep / tp GPUs, at least one
    expert a group (ep on a dense model splits nothing: a typo for tp, or the wrong model)."""
    from rooflight.agent.roofline.models import dense_ep_refusal

    if model is None:
        return
    tp, ep, name = target.tp, target.ep, target.name
    if tp is not None and model.n_heads % tp:
        fits = ", ".join(str(n) for n in range(1, min(model.n_heads, MAX_TENSOR_PARALLEL) + 1) if model.n_heads % n == 0)
        raise ConfigError(f"target {name}: tp {tp}: {model.name}'s {model.n_heads} attention heads cannot be split over"
                          f" {tp} GPUs; write one of {fits}")
    if not ep or ep <= 1:
        return
    if not model.is_moe:
        raise ConfigError(f"target {name}: {dense_ep_refusal(model.name, ep)}")
    per = tp if tp is not None else MAX_TENSOR_PARALLEL
    if ep > model.n_experts * per:
        over = f"ep {ep} over tp {tp} is {-(-ep // tp)} expert groups" if tp is not None else \
            f"ep {ep} is more than {model.n_experts * per:,} GPUs even at tp {per:,}"
        raise ConfigError(f"target {name}: {over}, but {model.name} has {model.n_experts} routed experts and each group"
                          f" holds at least one; write at most ep {model.n_experts * per:,}"
                          + ("" if tp is not None else " (or give tp)"))


def cmd_run(args: argparse.Namespace) -> int:
    from rooflight.agent.proxy.config import for_agent
    from rooflight.agent.sampling.memory import map_big_blocks
    from rooflight.agent.sampling.gc_tuning import tune_for_sampling
    from rooflight.agent.sampling.sampler import Agent

    config = load_config(args)
    proxy = for_agent(config)  # the proxy's SLOs, buckets and upstream, checked now: exit 2 when bad
    models = resolve_models(config)
    security = None
    if config.web_config:
        from rooflight.agent.serve.webconfig import WebSecurity

        security = WebSecurity(config.web_config)  # a bad or empty file stops the start here: exit 2
    if (security is None or not security.config.users) and not _loopback(config.listen_host):
        log.warning("listening on %s with %s: anyone who can reach it reads /metrics and the status"
                    " page; give --web-config with basic_auth_users, or listen on 127.0.0.1 (docs/security.md)",
                    config.listen, "no web config" if security is None else "a web config without basic_auth_users")
    if args.check_only:
        print(f"configuration ok: {len(config.targets)} target(s), listen {config.listen}{_proxy_line(proxy)}")
        return 0
    from rooflight.agent.serve.server import ServerLimits, serve

    limits = ServerLimits(read_header_timeout=config.read_header_timeout, max_connections=config.max_connections)
    tune_for_sampling()
    map_big_blocks()
    asyncio.run(serve(Agent(config, models=models), config.listen_host, config.listen_port, security=security,
                      limits=limits, proxy=proxy))
    return 0


def _proxy_line(proxy: Any) -> str:
    """`--check-only`'s words for the proxy: where it listens, where it relays, its SLOs."""
    if proxy is None:
        return ""
    from rooflight.agent.config.urls import shown_url

    slos = ", ".join(s.name for s in proxy.slos) or "none"
    return f"; proxy {proxy.listen} -> {shown_url(proxy.upstream)} (target {proxy.target}), SLOs: {slos}"


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rooflight",
        description="Sidecar exporter that puts LLM serving on the roofline: live MBU for decode, MFU for prefill.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rooflight {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser("run", help="watch one or more engines and serve /metrics", epilog=RUN_EPILOG,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    settings.add_flags(run, settings.RUN)
    run.set_defaults(func=cmd_run)
    from rooflight.agent.demo import cli as demo_cli
    from rooflight.agent.proxy import cli as proxy_cli
    from rooflight.agent import plan_cli as plan
    from rooflight.rules import generate as rules_generate

    # Every subcommand ships with the package: an ImportError here is a bug and must show, not drop a command.
    for module in (demo_cli, proxy_cli, plan, rules_generate):
        module.register(sub)
    return parser


def log_level(flag: str | None, environ: Mapping[str, str]) -> int:
    """The logging level from --log-level, else ROOFLIGHT_LOG_LEVEL, else info; ConfigError if unknown."""
    if flag is not None:
        return LOG_LEVELS[flag]
    value = environ.get("ROOFLIGHT_LOG_LEVEL", "") or "info"
    if value.strip().lower() not in LOG_LEVELS:
        raise ConfigError(f"ROOFLIGHT_LOG_LEVEL={value!r}: choose one of {', '.join(LOG_LEVELS)}")
    return LOG_LEVELS[value.strip().lower()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        level = log_level(getattr(args, "log_level", None), os.environ)
    except ConfigError as exc:
        print(f"rooflight: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"rooflight: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `rooflight plan | head`: the reader left, nothing is wrong
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
