"""`rooflight demo`: a simulated vLLM serving Llama-3-8B on a simulated H100, watched by the real agent.

The agent scrapes the simulated engine over HTTP and reads the simulated GPU through the NVML
collector, exactly as it would a real deployment; only the two sources are simulated.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from rooflight.agent.config import agent as cfg
from rooflight.agent.config import settings
from rooflight.agent.config.values import detector_flags, split_listen

DEMO_EPILOG = """\
scenarios:
  steady        chat traffic; decode well below the roofs, MBU the number to watch
  head-of-line  steady plus an 8,000-token prompt every ~20 s, prefilled whole: every stream stalls ~260 ms
                (43x a step), the worst ITL ~5x its recent median, and the head-of-line detector fires
  kv-wall       long outputs at a high rate: KV pinned at 100%, preemptions climb, requests wait
  queue         max_num_seqs 16: the batch sits at its configured cap while KV has room
  idle          no traffic: rates read 0 and percentiles are absent, as on an engine nobody calls

faults (--fault, repeatable; seconds from the start):
  hang@30s  stuck-gauges@30s  503@20s[:60s]  down@0s:24s (a model load)  crash-loop@20s:15s:3s  gpu-lost@30s
  5xx@30s:5% (that share of the finished requests answered 5xx)
"""


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the agent on a built-in simulated engine (no GPU, no engine needed)",
                       epilog=DEMO_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    settings.add_flags(p, settings.DEMO)
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from rooflight.agent.demo import SCENARIOS, DemoConfig

    if args.scenario not in SCENARIOS:
        from rooflight.agent.errors import ConfigError

        raise ConfigError(f"--scenario {args.scenario!r}: choose one of {', '.join(SCENARIOS)}")
    from rooflight.agent.demo.faults import parse_fault

    faults = tuple(parse_fault(spec) for spec in args.fault or ())
    host, port = split_listen(args.engine_listen)
    config = DemoConfig(scenario=args.scenario, seed=args.seed, max_num_seqs=args.max_num_seqs,
                        chunked_prefill=args.chunked_prefill, time_scale=args.time_scale)
    from rooflight.agent.sampling.gc_tuning import tune_for_sampling

    tune_for_sampling()
    asyncio.run(_demo(config, host, port, args, faults))
    return 0


async def _demo(demo_config: Any, engine_host: str, engine_port: int, args: argparse.Namespace,
                faults: tuple[Any, ...] = ()) -> None:
    from rooflight.agent.serve.server import serve
    from rooflight.agent.demo import start_demo_engine
    from rooflight.agent.sampling.sampler import Agent

    try:
        engine = await start_demo_engine(demo_config, engine_host, engine_port, faults=faults)
    except OSError as exc:  # the port is taken, privileged, or not on this machine: say so (exit 2)
        from rooflight.agent.errors import ConfigError
        from rooflight.agent.serve.server import bind_error

        raise ConfigError(f"--engine-listen: {bind_error(exc, engine_host, engine_port)}") from None
    try:
        # the user of an engine knows its max_num_seqs (vLLM does not export it): pass it, as --batch-max would
        given = {"engine_url": [engine.url], "listen": args.listen, "interval": args.interval,
                    "batch_max": engine.sim.max_num_seqs, "target_name": args.target_name,
                    "gpu_hour_cost": args.gpu_hour_cost, "canary": args.canary,
                 "detectors": detector_flags(args.detectors) if args.detectors else None}
        config = cfg.build({}, {}, given)
        agent = Agent(config, nvml_lib=engine.nvml, process_pids={config.targets[0].name: os.getpid()})
        host, port = config.listen_host, config.listen_port
        print(f"rooflight demo: simulated vLLM ({demo_config.scenario}) at {engine.url}/metrics", flush=True)
        print(f"  watch http://{host}:{port}/ (status page: roofline, detectors), /metrics, /api/v1/snapshot", flush=True)
        print("  decode: rooflight_mbu_ratio; prefill: rooflight_mfu_ratio{phase=\"prefill\"};"
              " tail: rooflight_itl_seconds{percentile=\"99\"}", flush=True)
        serving = asyncio.create_task(serve(agent, host, port))
        if args.duration is not None:
            done, _ = await asyncio.wait({serving}, timeout=args.duration)
            if not done:
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)
            else:
                serving.result()  # a bad --listen (ConfigError) ends the demo with exit 2
        else:
            await serving
    finally:
        await engine.stop()
