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

EPILOG = f"""\
the proxy relays every request to --upstream unchanged (streams chunk by chunk) and serves, on
--metrics-listen, rooflight_client_* metrics: TTFT, every inter-token gap, TPOT and end-to-end latency as
histograms and exact 10s/1m/5m percentiles, tokens, requests by status and finish reason, and goodput:
the share of streamed requests meeting every target of an SLO (DistServe). See docs/proxy.md.

examples:
  rooflight proxy --upstream http://127.0.0.1:8000 --listen 0.0.0.0:8100 --slo ttft=0.5,tpot=0.05
  rooflight proxy --upstream http://127.0.0.1:8000 --slo ttft=0.25,tpot=0.03 --slo ttft=2,tpot=0.1 \\
      --tenant-header X-Tenant-Id --tenant-top 20

defaults: --listen {pc.DEFAULT_LISTEN}, --metrics-listen {pc.DEFAULT_METRICS_LISTEN}.
"""


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upstream", metavar="URL", help="the OpenAI-compatible server, e.g. http://127.0.0.1:8000 (required)")
    p.add_argument("--listen", metavar="HOST:PORT", help=f"where clients connect (default {pc.DEFAULT_LISTEN})")
    p.add_argument("--metrics-listen", metavar="HOST:PORT",
                   help=f"where to serve /metrics, a port of its own (default {pc.DEFAULT_METRICS_LISTEN})")
    p.add_argument("--slo", action="append", metavar="KEY=SECONDS,...",
                   help="a joint SLO for goodput, keys ttft, tpot, e2e, e.g. ttft=0.5,tpot=0.05 (repeatable)")
    p.add_argument("--tenant-header", metavar="NAME", help="attribute requests to tenants by this header (hashed)")
    p.add_argument("--tenant-top", metavar="N", help="tenants named in labels; the rest are `other` (default 10)")
    p.add_argument("--buckets", action="append", metavar="NAME=EDGE,...",
                   help="histogram edges in seconds for ttft, itl, tpot or e2e (repeatable); SLO targets are added")
    p.add_argument("--windows", metavar="LIST", help=f"percentile and goodput windows (default {pc.DEFAULT_WINDOWS})")
    p.add_argument("--percentiles", metavar="LIST", help=f"exported percentiles (default {pc.DEFAULT_PERCENTILES})")
    p.add_argument("--connect-timeout", metavar="SECONDS", help="upstream connect timeout (default 10s); no read timeout")
    p.add_argument("--read-header-timeout", metavar="SECONDS",
                   help="a request's headers must arrive within this of its first byte (default 10s)")
    p.add_argument("--read-body-timeout", metavar="SECONDS",
                   help="close a connection whose request body sends no byte for this long (default 10s)")
    p.add_argument("--idle-timeout", metavar="SECONDS", help="close a keep-alive connection idle this long (default 60s)")
    p.add_argument("--max-connections", metavar="N", help="connections open on --listen at once (default 4096)")
    p.add_argument("--max-connections-per-client", metavar="N",
                   help="of them, held by one IP address (default half of --max-connections)")
    p.add_argument("--upstream-credentials-for-anonymous", action="store_true",
                   help="add --upstream's user:password to requests that carry no Authorization of their own"
                        " (anyone who reaches --listen is lent them); without it a user:password is refused")
    p.add_argument("--workers", metavar="N", help="relay processes sharing --listen (SO_REUSEPORT), one /metrics (default 1)")
    p.add_argument("--check-only", action="store_true", help="validate the flags and exit")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def config_from_args(args: argparse.Namespace) -> pc.ProxyConfig:
    """The flags as parsed -> a validated ProxyConfig (ConfigError on a bad one)."""
    return pc.build(
        args.upstream, listen=args.listen, metrics_listen=args.metrics_listen, slos=args.slo,
        tenant_header=args.tenant_header, tenant_top=args.tenant_top, buckets=args.buckets,
        windows=args.windows, percentiles=args.percentiles, connect_timeout=args.connect_timeout,
        upstream_credentials_for_anonymous=args.upstream_credentials_for_anonymous,
        read_header_timeout=args.read_header_timeout, idle_timeout=args.idle_timeout,
        max_connections=args.max_connections, max_connections_per_client=args.max_connections_per_client,
        read_body_timeout=args.read_body_timeout,
    )


def cmd_proxy(args: argparse.Namespace) -> int:
    from rooflight.agent.proxy import workers as pw  # --workers (agent/proxy/workers.py)

    config, n_workers = config_from_args(args), pw.parse_workers(getattr(args, "workers", None))
    if args.check_only:
        slos = ", ".join(s.name for s in config.slos) or "none"
        print(f"configuration ok: {pc.printable(config.listen)} -> {pc.shown_url(config.upstream)}, metrics on {config.metrics_listen}, SLOs: {slos}")
        return 0
    if n_workers > 1:
        return asyncio.run(pw.run(config, n_workers))
    asyncio.run(run(config))
    return 0


async def run(config: pc.ProxyConfig) -> None:
    """Serve until SIGINT or SIGTERM: the relay on an event loop and thread of its own (agent/proxy/thread.py),
    /metrics on this one, so scrapes never queue in front of a token."""
    from rooflight.agent.proxy.server import ProxyServer, serve_metrics
    from rooflight.agent.proxy.thread import ProxyThread

    server = ProxyServer(config)
    proxy = ProxyThread(server)
    from rooflight.agent.proxy.limits import quiet_accept_errors

    quiet_accept_errors(asyncio.get_running_loop())  # /metrics' loop; the relay's installs its own
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
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
    add_flags(p)
    p.set_defaults(func=cmd_proxy)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m rooflight.agent.proxy.cli ...`: the subcommand on its own, with the CLI's exit codes."""
    parser = argparse.ArgumentParser(prog="rooflight proxy", epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(parser)
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
