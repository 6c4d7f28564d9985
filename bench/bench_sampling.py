"""How much one engine sample costs, against prometheus_client's parser as the yardstick.

Sampling must be cheap enough to run at 10 Hz next to a busy engine. On one recorded vLLM page
(default tests/fixtures/engine-samples/vllm-cpu-load-c16.prom) this prints, per call:
  (a) prometheus_client.parser.text_string_to_metric_families alone (the yardstick);
  (b) our parse + normalize (rooflight.collectors.vllm.parse), and b/a (target <= 0.10);
  (c) a full cycle: HTTP GET over loopback with aiohttp from a server in another process (as the
      engine would be), parse + normalize, append to the series history and
      rooflight.agent.signals.derive.derive_target over the 10s/1m/5m windows, and c/a (target <= 0.25).
      If rooflight.agent.signals.derive cannot be used, (c) is reported as partial.
Wall time is the headline; (c) also prints the CPU time this process spent per cycle.
Timing is printed, never asserted: tests must not depend on the machine's speed.

Run from the repository root:  python bench/bench_sampling.py [--file PAGE] [--cycles N]
`rss_over_time` is the hook for the later memory measurement (RSS after minutes at 1 Hz and 10 Hz
on the demo); the demo driver itself is not written yet.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import time
import timeit
from pathlib import Path
from typing import Any, Awaitable, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from rooflight.collectors import vllm  # noqa: E402

DEFAULT_PAGE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "engine-samples" / "vllm-cpu-load-c16.prom"
WINDOWS = {"10s": 10.0, "1m": 60.0, "5m": 300.0}


def per_call(fn: Callable[[], Any], number: int, repeat: int = 5) -> float:
    """Median over `repeat` runs of the mean seconds per call of `fn` over `number` calls."""
    return statistics.median(t / number for t in timeit.repeat(fn, number=number, repeat=repeat))


def _serve(body: bytes, port_out: Any) -> None:
    """Child process: serve `body` at /metrics on 127.0.0.1 until killed."""
    from aiohttp import web

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_out.send(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


class Deriver:
    """rooflight.agent.signals.derive.derive_target fed from one history per series, if the agent side is importable."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.results = 0  # window results derived so far (proof the derivations ran)
        try:
            from rooflight.agent.signals import derive
            from rooflight.agent.signals import windows

            self._derive, self._windows = derive, windows
        except Exception as exc:  # noqa: BLE001 - any import failure means "not available yet"
            self.error = f"{type(exc).__name__}: {exc}"
            return
        self.histories: dict[tuple[str, str], Any] = {}
        self.constants = _constants()

    def __call__(self, sample: vllm.EngineSample, t: float) -> int:
        """Append and derive; returns how many window results came out."""
        if self.error is not None:
            return 0
        produced = 0
        try:
            for series in sample.series:
                key = (series.model, series.rank)
                history = self.histories.get(key)
                if history is None:
                    history = self.histories[key] = self._windows.SeriesHistory(retention=330.0)
                history.append(t, *self._derive.history_inputs(series))
                produced += len(
                    self._derive.derive_target(history, WINDOWS, self.constants, series.kv_capacity_tokens)
                )
        except Exception as exc:  # noqa: BLE001 - the agent side is still moving; report, do not crash
            self.error = f"{type(exc).__name__}: {exc}"
        self.results += produced
        return produced


def _constants() -> Any:
    """An 8B-class model on the default GPU profile, so MBU/MFU are computed too; None if unavailable."""
    try:
        from rooflight.agent.roofline.constants import TargetConstants
        from rooflight.agent.roofline.gpus import DEFAULT_PROFILE_KEY, get_profile
        from rooflight.agent.roofline.models import PRESETS

        model = next(iter(PRESETS.values()))
        return TargetConstants(model=model, gpu=get_profile(DEFAULT_PROFILE_KEY), gpu_source="default")
    except Exception:  # noqa: BLE001
        return None


async def full_cycles(url: str, cycles: int, deriver: Deriver) -> tuple[list[float], list[float]]:
    """Run `cycles` fetch+parse+derive cycles; wall and CPU seconds of each. Fake 1 s clock for t."""
    import aiohttp

    walls, cpus = [], []
    async with aiohttp.ClientSession() as session:
        for i in range(cycles):
            w0, c0 = time.perf_counter(), time.process_time()
            async with session.get(url) as response:
                body = await response.read()
            text = body.decode("utf-8")
            sample = vllm.parse(text, target="bench", timestamp=float(i), duration=time.perf_counter() - w0)
            deriver(sample, float(i))
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
    return walls, cpus


async def rss_over_time(
    cycle: Callable[[], Awaitable[None]], hz: float, seconds: float
) -> list[tuple[float, int]]:
    """Run `cycle` at `hz` for `seconds`; (elapsed s, RSS bytes) once a second.

    The hook for the memory measurement (RSS after minutes on the demo at 1 Hz and 10 Hz): the
    caller supplies the cycle (later: one demo-engine sample through the real sampler).
    """
    import psutil

    proc, out = psutil.Process(), []
    start = time.monotonic()
    next_report = 0.0
    while (elapsed := time.monotonic() - start) < seconds:
        await cycle()
        if elapsed >= next_report:
            out.append((elapsed, proc.memory_info().rss))
            next_report += 1.0
        await asyncio.sleep(max(0.0, 1.0 / hz - (time.monotonic() - start - elapsed)))
    return out


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--file", type=Path, default=DEFAULT_PAGE)
    args.add_argument("--cycles", type=int, default=400)
    args.add_argument("--number", type=int, default=50, help="calls per timing run for (a) and (b)")
    args.add_argument("--memory-minutes", type=float, default=6.0,
                      help="minutes of `rooflight run` on the demo at 1 Hz and at 10 Hz (0 skips; the 5m window"
                           " fills in the first 5)")
    opts = args.parse_args(argv)
    print("$ python bench/bench_sampling.py " + " ".join(sys.argv[1:] if argv is None else argv))
    text = opts.file.read_text()
    print(f"page: {opts.file.name} ({len(text)} bytes, {text.count(chr(10))} lines); python {sys.version.split()[0]}")

    a = per_call(lambda: list(text_string_to_metric_families(text)), opts.number)
    b = per_call(lambda: vllm.parse(text, target="bench", timestamp=0.0, duration=0.0), opts.number * 4)
    print(f"(a) prometheus_client parser      {a * 1e3:8.3f} ms/call")
    print(f"(b) expfmt + vllm normalize        {b * 1e3:8.3f} ms/call   b/a = {b / a:.3f}  (target <= 0.10)")

    receive, send = multiprocessing.Pipe(duplex=False)
    server = multiprocessing.Process(target=_serve, args=(text.encode(), send), daemon=True)
    server.start()
    try:
        port = receive.recv()
        deriver = Deriver()
        warmup = min(50, opts.cycles)
        walls, cpus = asyncio.run(full_cycles(f"http://127.0.0.1:{port}/metrics", opts.cycles + warmup, deriver))
    finally:
        server.kill()
        server.join()
    c, c_cpu = statistics.median(walls[warmup:]), statistics.median(cpus[warmup:])
    label = "(c) fetch + parse + derive      " if deriver.error is None else "(c) partial: derive not available"
    print(f"{label}  {c * 1e3:8.3f} ms/cycle c/a = {c / a:.3f}  (target <= 0.25); cpu {c_cpu * 1e3:.3f} ms/cycle")
    if deriver.error is not None:
        print(f"    derive: {deriver.error}")
    else:
        consts = "with" if deriver.constants is not None else "without"
        print(f"    {opts.cycles} cycles after {warmup} warm-up, fake 1 s clock, windows {list(WINDOWS)}, {consts} model constants,"
              f" {deriver.results} window results derived")
    if opts.memory_minutes > 0:
        sys.path.insert(0, str(Path(__file__).parent))
        import bench_memory

        bench_memory.report(opts.memory_minutes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
