"""`rooflight proxy`: the subcommand, registered by agent/cli.py with `register(sub)`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from typing import Any, Sequence

from rooflight.agent.errors import ConfigError
from rooflight.agent.proxy import config as pc
from rooflight.agent.config import settings
from rooflight.agent.config.urls import printable, shown_url

EPILOG = f"""\
the proxy relays every request to --upstream unchanged (streams chunk by chunk) and serves, on
--metrics-listen, rooflight_client_* metrics: TTFT, every inter-token gap, TPOT and end-to-end latency as
histograms and exact 10s/1m/5m percentiles, tokens, requests by status and finish reason, and goodput:
the share of streamed requests meeting every target of an SLO (DistServe). See docs/proxy.md.

examples:
  rooflight proxy --upstream http://127.0.0.1:8000 --listen 0.0.0.0:8100 --slo ttft=0.5,tpot=0.05
  rooflight proxy --upstream http://127.0.0.1:8000 --slo ttft=0.25,tpot=0.03 --slo ttft=2,tpot=0.1 \\
      --tenant-header X-Tenant-Id --tenant-top 20

defaults: --listen {settings.PROXY_LISTEN}, --metrics-listen {settings.PROXY_METRICS_LISTEN}.
"""


def config_from_args(args: argparse.Namespace) -> pc.ProxyConfig:
    """The flags as parsed -> a validated ProxyConfig (ConfigError on a bad one)."""
    given = settings.flag_values(args, settings.PROXY)
    for key in ("check_only", "log_level", "workers"):  # the command's, not the relay's (workers: cmd_proxy)
        given.pop(key, None)
    # build()'s parameters for the settings keyed slo and proxy_buckets (their file keys under `rooflight run`)
    given["slos"], given["buckets"] = given.pop("slo", None), given.pop("proxy_buckets", None)
    return pc.build(given.pop("upstream", None), **given)


def cmd_proxy(args: argparse.Namespace) -> int:
    from rooflight.agent.proxy import workers as pw  # --workers (agent/proxy/workers.py)

    config, n_workers = config_from_args(args), pw.parse_workers(getattr(args, "workers", None))
    if args.check_only:
        slos = ", ".join(s.name for s in config.slos) or "none"
        print(f"configuration ok: {printable(config.listen)} -> {shown_url(config.upstream)}, metrics on {config.metrics_listen}, SLOs: {slos}")
        return 0
    if n_workers > 1:
        return asyncio.run(pw.run(config, n_workers))
    asyncio.run(run(config))
    return 0


async def run(config: pc.ProxyConfig) -> None:
    """Serve until SIGINT or SIGTERM: the relay on an event loop and thread of its own (agent/proxy/thread.py),
    /metrics on this one, so scrapes never queue in front of a token."""
    from rooflight.agent.proxy.journal import opened
    from rooflight.agent.proxy.server import ProxyServer

    with opened(config.request_log) as journal:
        await _serve(ProxyServer(config, journal=journal))


async def _serve(server: Any) -> None:
    from rooflight.agent.proxy.journal import reopen_on_hangup
    from rooflight.agent.proxy.limits import quiet_accept_errors
    from rooflight.agent.proxy.server import serve_metrics
    from rooflight.agent.proxy.thread import ProxyThread

    config = server.config
    proxy = ProxyThread(server)
    quiet_accept_errors(asyncio.get_running_loop())  # /metrics' loop; the relay's installs its own
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    reopen_on_hangup(server.journal)
    try:
        await proxy.start(serve_metrics=False)
    except OSError as exc:
        raise _bind_error("--listen", config.listen, exc) from None
    try:
        try:
            metrics = await serve_metrics(server)
        except OSError as exc:
            raise _bind_error("--metrics-listen", config.metrics_listen, exc) from None
        try:
            await stop.wait()
        finally:
            await metrics.cleanup()
    finally:
        await proxy.stop()


def _bind_error(flag: str, listen: str, exc: OSError) -> ConfigError:
    why = exc.strerror or str(exc)
    return ConfigError(f"{flag} {listen}: cannot listen there ({why}); stop the other process or choose another"
                       " address or port")


def register(sub: Any) -> argparse.ArgumentParser:
    """Add `proxy` to the CLI's subparsers."""
    p = sub.add_parser("proxy", help="a reverse proxy in front of an OpenAI-compatible server: client-side TTFT/ITL and goodput",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    settings.add_flags(p, settings.PROXY)
    p.set_defaults(func=cmd_proxy)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m rooflight.agent.proxy.cli ...`: the subcommand on its own, with the CLI's exit codes."""
    parser = argparse.ArgumentParser(prog="rooflight proxy", epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    settings.add_flags(parser, settings.PROXY)
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return cmd_proxy(args)
    except ConfigError as exc:
        print(f"rooflight: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
