"""Where `rooflight run`'s CPU goes, step by step, measured in its own threads' CPU time.

bench/bench_process_cpu.py says what the whole process costs; its `--profile` (py-spy) says where, but a
sampling profiler counts a thread that waits for the GIL or a core as busy, which on a 2-core machine
shared with the engine misplaces a good part of the time. This runs the agent as `rooflight run` does,
in this process, with each step wrapped in `time.thread_time()` (the CPU its own thread used, nothing
else's): the page fetch, the adapter's parse, the history append (`_remember`), the derivations and
view (`_rebuild_view`), the publish, and the process sources' read (in their worker thread). After
`--warmup` seconds (160 by default: the 5m window half full, as bench_process_cpu.py waits) the
counts start; after `--seconds` more it prints the process's CPU and each step's share of it, its CPU
per call and calls per second, and exits. The fetch is timed at one target only: its figure includes
whatever ran on the event loop while it awaited, which at more targets is the other targets' steps; there
it is in "the rest".

Python's cycle collector is timed too (a `gc.callbacks` hook, in the thread it interrupts): its share of
the process, its collections a second by generation, their mean and worst pause (a pause of every loop and
of /metrics). Its time is inside the steps it interrupted.

Pages: the fake engine of bench_process_cpu.py (`--serve`), started here, the same moving vLLM pages.
Figures are printed, never asserted.

Run from the repository root:
    python bench/agent_steps.py [--targets 1] [--hz 10] [--warmup 160] [--seconds 30]
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import inspect
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rooflight.agent.sampling import engine_loop, sampler  # noqa: E402
from rooflight.collectors import engines  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from bench_process_cpu import DEFAULT_PAGE, free_port, start_server  # noqa: E402

spent: collections.Counter[str] = collections.Counter()
calls: collections.Counter[str] = collections.Counter()
collecting: dict[int, float] = {}  # the thread CPU time at which a collection started, by thread
collected: dict[int, list[float]] = collections.defaultdict(list)  # each collection's seconds, by generation


def time_collections(phase: str, info: dict[str, int]) -> None:
    """A gc.callbacks hook: each collection's thread CPU time, by generation."""
    key = threading.get_ident()
    if phase == "start":
        collecting[key] = time.thread_time()
    elif key in collecting:
        collected[info["generation"]].append(time.thread_time() - collecting.pop(key))


def timed(owner: Any, name: str, label: str) -> None:
    """Replace owner.name with a wrapper adding its thread CPU seconds to `label`."""
    fn = getattr(owner, name)
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def step(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return await fn(*args, **kwargs)
            finally:
                spent[label] += time.thread_time() - t0
                calls[label] += 1
    else:
        @functools.wraps(fn)
        def step(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] += time.thread_time() - t0
                calls[label] += 1
    setattr(owner, name, step)


def instrument(targets: int) -> None:
    if targets == 1:  # with more, what runs while a fetch awaits is the other targets' steps
        timed(engine_loop.EngineLoop, "_fetch", "fetch (event loop while awaiting)")
    for adapter in engines.adapters():
        timed(adapter, "parse", "parse")
    timed(engine_loop.EngineLoop, "_remember", "history append")
    timed(engine_loop.EngineLoop, "_rebuild_view", "derivations and view")
    timed(sampler.Agent, "publish", "publish")
    timed(sampler, "_read_trees", "process sources (worker thread)")


def report(warmup: float, seconds: float, engine: subprocess.Popen[str]) -> None:
    """Clear the counts after `warmup`, print them `seconds` later, and end the process (and the engine)."""
    time.sleep(warmup)
    spent.clear()
    calls.clear()
    collected.clear()
    t0 = time.process_time()
    time.sleep(seconds)
    total = time.process_time() - t0
    print(f"process CPU {total / seconds * 100:.2f}% of a core over {seconds:.0f} s after {warmup:.0f} s", flush=True)
    for label, cpu in spent.most_common():
        print(f"  {label:<36} {cpu / total * 100:5.1f}%  {cpu / max(calls[label], 1) * 1e6:7.0f} us a call"
              f"  {calls[label] / seconds:6.1f} calls/s", flush=True)
    rest = "the rest (event loop, ...)" if any(label.startswith("fetch") for label in spent) else \
        "the rest (fetch, event loop, ...)"
    print(f"  {rest:<36} {(1 - sum(spent.values()) / total) * 100:5.1f}%", flush=True)
    pauses = [p for generation in collected.values() for p in generation]
    print(f"python's cycle collector {sum(pauses) / total * 100:.1f}% (inside the steps above), threshold"
          f" {gc.get_threshold()}, {gc.get_freeze_count()} objects frozen, {len(gc.get_objects())} tracked", flush=True)
    for generation, times in sorted(collected.items()):
        print(f"  generation {generation}: {len(times) / seconds:5.2f} a second, {sum(times) / len(times) * 1e3:6.1f} ms"
              f" each, worst {max(times) * 1e3:6.1f} ms", flush=True)
    engine.kill()
    os._exit(0)  # the agent's loops run until a signal; the counts are all this run is for


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--targets", type=int, default=1)
    args.add_argument("--hz", type=float, default=10.0)
    args.add_argument("--warmup", type=float, default=160.0)
    args.add_argument("--seconds", type=float, default=30.0)
    opts = args.parse_args()
    engine, ports = start_server(DEFAULT_PAGE, max(opts.targets, 8))
    try:
        ports = ports[: opts.targets]
        print(f"$ python bench/agent_steps.py --targets {opts.targets} --hz {opts.hz:g} --warmup {opts.warmup:g}"
              f" --seconds {opts.seconds:g}", flush=True)
        instrument(opts.targets)
        gc.callbacks.append(time_collections)
        threading.Thread(target=report, args=(opts.warmup, opts.seconds, engine), daemon=True).start()
        from rooflight.agent.cli import main as rooflight

        urls = [arg for port in ports for arg in ("--engine-url", f"http://127.0.0.1:{port}")]
        rooflight(["run", "--interval", str(1 / opts.hz), "--model", "llama-3-8b",
                   "--listen", f"127.0.0.1:{free_port()}", "--log-level", "warning", *urls])
    finally:
        engine.kill()


if __name__ == "__main__":
    main()
