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
from rooflight.agent.sampling import config as cfg
from rooflight.agent.errors import ConfigError

log = logging.getLogger("rooflight")
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

RUN_EPILOG = """\
what you get on /metrics (every name starts with rooflight_):
  decode is judged by MBU (bytes it must stream per second / HBM peak), prefill by MFU (FLOP/s / dense peak),
  tokens/s per phase, TTFT and ITL percentiles over 10s/1m/5m windows, KV occupancy, preemptions, and
  detectors for head-of-line blocking and capacity-capped or admission-bound batches. "GPU util" is exported
  as rooflight_gpu_kernel_residency_ratio, named for what it measures.

the client's view too: --proxy-listen HOST:PORT runs `rooflight proxy` in the same process, in front of
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


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML file with these settings (flags override it)")
    p.add_argument("--engine-url", action="append", metavar="URL",
                   help="engine API base, e.g. http://127.0.0.1:8000 (repeat for several engines)")
    p.add_argument("--engine", metavar="NAME", help="engine kind; default auto (recognised from its /metrics)")
    p.add_argument("--metrics-path", metavar="PATH", help="override the engine's metrics path")
    p.add_argument("--target-name", metavar="NAME",
                   help="the engine's `target` label (default host:port; in Kubernetes, the pod's name)")
    model = p.add_mutually_exclusive_group()
    model.add_argument("--model", metavar="PRESET", help="model preset (see `rooflight plan --list`)")
    model.add_argument("--model-config", metavar="PATH", help="a Hugging Face config.json for the served model")
    p.add_argument("--weight-dtype", metavar="DTYPE", help="bf16, fp16, fp8, int8 or int4 (default: from config)")
    p.add_argument("--kv-dtype", metavar="DTYPE", help="KV-cache dtype; fp8 halves KV bytes (default: weights')")
    p.add_argument("--gpu", metavar="PROFILE", help="GPU constants profile, e.g. h100-sxm (default: the NVML name's, none for a GPU without "
                   "constants: its MBU/MFU stay absent; h100-sxm where no GPU is seen)")
    p.add_argument("--tp", type=int, metavar="N", help="tensor-parallel size: GPUs one model copy spans (default: what the engine says, "
                   "else the GPUs its processes use / its data-parallel ranks, else 1; the engine wins over this)")
    p.add_argument("--ep", type=int, metavar="N", help="expert-parallel size of a MoE engine (vLLM --enable-expert-parallel: "
                   "data-parallel x tensor-parallel size): each copy holds 1/(ep/tp) of the routed experts (default: 1)")
    p.add_argument("--draft-model", metavar="PRESET", help="speculative decoding's draft model (a preset or Hugging Face id): "
                   "its weights join MBU once per draft token a step")
    p.add_argument("--draft-model-config", metavar="PATH", help="the draft model's config.json (instead of --draft-model)")
    p.add_argument("--batch-max", type=int, metavar="N", help="the engine's batch cap (vLLM max_num_seqs) where /metrics lacks it")
    p.add_argument("--pid", type=int, help="the engine's PID, for its CPU and memory (default: found by the URL's port)")
    p.add_argument("--listen", metavar="HOST:PORT", help=f"where to serve /metrics (default {cfg.DEFAULT_LISTEN})")
    p.add_argument("--interval", metavar="SECONDS", help="sampling interval, 0.1s to 60s (default 1s)")
    p.add_argument("--scrape-timeout", metavar="SECONDS", help="engine scrape timeout (default 5s; vLLM can take seconds under load)")
    p.add_argument("--windows", metavar="LIST", help="window lengths (default 10s,1m,5m)")
    p.add_argument("--percentiles", metavar="LIST", help="TTFT/ITL percentiles (default 50,90,99)")
    p.add_argument("--no-nvml", dest="nvml", action="store_const", const=False, help="do not read NVML")
    p.add_argument("--gpus", choices=("own", "all"),
                   help="GPUs to export: own (the engines' GPUs, found from NVML's processes; default) or all "
                        "(every GPU on the node: a node-level agent)")
    p.add_argument("--no-process", dest="process", action="store_const", const=False, help="do not read the engine process")
    p.add_argument("--web-config", metavar="FILE", help="TLS and basic auth, exporter-toolkit web-config.yml format")
    p.add_argument("--read-header-timeout", metavar="SECONDS",
                   help="close a connection that has not sent a request's headers within this (default 10s)")
    p.add_argument("--max-connections", type=int, metavar="N",
                   help="open connections to the agent at most; more are answered 503 (default 256)")
    p.add_argument("--detector", action="append", metavar="KEY=VALUE", help="a detector threshold, e.g. hol_inflation=4")
    cap = p.add_argument_group("capacity signals (docs/metrics.md, section Capacity, cost and energy)")
    cap.add_argument("--role", choices=("both", "prefill", "decode"),
                     help="the engine's part in disaggregated serving (default: its config's, else both)")
    cap.add_argument("--ttft-slo", metavar="SECONDS", help="TTFT SLO for rooflight_headroom_ratio{resource=\"ttft_slo\"}")
    cap.add_argument("--itl-slo", metavar="SECONDS", help="ITL SLO for rooflight_headroom_ratio{resource=\"itl_slo\"}")
    cap.add_argument("--gpu-hour-cost", type=float, metavar="PRICE",
                     help="price of one GPU-hour, any currency: gives rooflight_cost_per_million_tokens")
    proxy = p.add_argument_group("client-side proxy (docs/proxy.md)")
    proxy.add_argument("--proxy-listen", metavar="HOST:PORT",
                       help="run the proxy here, e.g. 0.0.0.0:8100: clients connect to it, its rooflight_client_* "
                            "metrics join this /metrics (default: off)")
    proxy.add_argument("--proxy-upstream", metavar="URL",
                       help="the OpenAI-compatible server the proxy relays to (default: the one --engine-url)")
    proxy.add_argument("--slo", action="append", metavar="KEY=SECONDS,...",
                       help="a joint SLO for goodput, keys ttft, tpot, e2e, e.g. ttft=0.5,tpot=0.05 (repeatable)")
    proxy.add_argument("--tenant-header", metavar="NAME", help="attribute requests to tenants by this header (hashed)")
    proxy.add_argument("--tenant-top", metavar="N", help="tenants named in labels; the rest are `other` (default 10)")
    proxy.add_argument("--proxy-buckets", action="append", metavar="NAME=EDGE,...",
                       help="client histogram edges in seconds for ttft, itl, tpot or e2e (repeatable)")
    p.add_argument("--check-only", action="store_true", help="validate the configuration and exit")
    p.add_argument("--log-level", default=None, choices=list(LOG_LEVELS),
                   help="debug, info, warning or error (default: ROOFLIGHT_LOG_LEVEL, else info)")


def _flag_settings(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("engine", "metrics_path", "model", "model_config", "weight_dtype", "kv_dtype", "gpu", "tp", "ep",
            "draft_model", "draft_model_config", "batch_max", "pid", "listen", "interval", "scrape_timeout", "windows", "percentiles", "nvml", "gpus", "process",
            "web_config", "read_header_timeout", "max_connections", "target_name", "proxy_listen", "proxy_upstream",
            "tenant_header", "tenant_top", "role", "ttft_slo", "itl_slo", "gpu_hour_cost")
    out = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    if args.engine_url:
        out["engine_url"] = args.engine_url
    for key in ("slo", "proxy_buckets"):  # repeatable: the flags' list replaces the file's and environment's
        if getattr(args, key, None):
            out[key] = getattr(args, key)
    if args.detector:
        out["detectors"] = _detector_flags(args.detector)
    return out


def _detector_flags(items: Sequence[str]) -> dict[str, float]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            raise ConfigError(f"--detector {item!r}: write KEY=NUMBER, e.g. hol_inflation=4") from None
        if not sep:
            raise ConfigError(f"--detector {item!r}: write KEY=NUMBER, e.g. hol_inflation=4")
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
    from rooflight.agent.roofline.plan import resolve_model

    try:
        return resolve_model(target.draft_model, target.draft_model_config, None, None)
    except ConfigError as e:
        raise ConfigError(f"target {target.name}: draft model: {e}") from None


def resolve_models(config: cfg.AgentConfig) -> dict[str, tuple[Any, str | None]]:
    """Load every model given by preset or config.json now, so a bad one stops the start (exit 2)."""
    from rooflight.agent.roofline.gpus import get_profile
    from rooflight.agent.roofline.models import load_config_json, preset

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
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from rooflight.agent.proxy.config import for_agent
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
    asyncio.run(serve(Agent(config, models=models), config.listen_host, config.listen_port, security=security,
                      limits=limits, proxy=proxy))
    return 0


def _proxy_line(proxy: Any) -> str:
    """`--check-only`'s words for the proxy: where it listens, where it relays, its SLOs."""
    if proxy is None:
        return ""
    from rooflight.agent.proxy.config import shown_url

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
    _add_run_flags(run)
    run.set_defaults(func=cmd_run)
    from rooflight.agent.demo import cli as demo_cli
    from rooflight.agent.proxy import cli as proxy_cli
    from rooflight.agent.roofline import plan
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
