"""How much one engine sample costs, measured like for like against prometheus_client's parser.

Sampling must be cheap enough to run at 10 Hz next to a busy engine. The recorded vLLM page (default
tests/fixtures/engine-samples/vllm-cpu-load-c16.prom) is turned into a run of pages whose counters move
as a real engine's do (`moving_pages`), so no call sees the text of the one before and every full cycle
has new tokens and new histogram observations to derive rates and percentiles from. Printed, per call:

  Full page, every family on it:
    (a) prometheus_client.parser.text_string_to_metric_families (the yardstick);
    (b) rooflight.collectors.expfmt.parse with no filter, and b/a.
  The families the vLLM adapter keeps (vllm.NAMES):
    (a') prometheus_client, then keep the same samples (it cannot skip a family before parsing it);
    (b') rooflight.collectors.vllm.parse: filtered parse + normalization into an EngineSample, and b'/a'
         (target <= 0.10). (a') stops at a list of samples, so b'/a' charges our normalization to us;
         the filtered read alone (expfmt.select, what the adapter reads with) is printed below it for the
         parse-to-parse figure, and expfmt.parse with the same filter beside it.
  Each cold (the first call in a fresh process, median over --cold-runs processes, each on its own
  page) and warm (median over rounds of --number calls, each call on the next moving page, after one
  untimed pass over them; the rounds of all five rows interleaved so a change in load hits each).
  (c) a full cycle, warm: HTTP GET over loopback with aiohttp from a server in another process serving
      the next moving page each time (as the engine would), vllm.parse, append to the series history and
      rooflight.agent.signals.derive.derive_window over each of the 10s/1m/5m windows; c/a with (a) the warm
      full-page yardstick above (target <= 0.25), and in how many cycles rates and percentiles came out.
      If rooflight.agent.signals.derive cannot be used, (c) is reported as partial.
  (c*) the same cycles with IDLE_S (100 ms) asleep between them, as the agent at 10 Hz is, and c*/c: the
      same work costs more CPU when the process wakes to it than back to back (its caches, the
      interpreter's and the data's, were filled by others while it slept). (a*) is the yardstick's parse
      after the same sleep, and c*/a* the ratio of the two when both wake to their work: a long parse
      pays for waking once over more work, so c*/a* is above c/a, and nearer what the whole process
      (bench/bench_process_cpu.py) measures.
Ratios are against the baseline measured in the same run. (a) and (b) are this process's CPU seconds
per call (the same as wall time on an idle machine, and not inflated by other work on a busy one); (c)
is printed as wall time per cycle (it waits on the server and the loopback) and as this process's CPU
time, both divided by the warm (a); on a busy machine the wall-time c/a overstates our share. Timing is printed, never
asserted: tests must not depend on the machine's speed. Garbage collection stays on, as in the agent.

Run from the repository root:  python bench/bench_sampling.py [--file PAGE] [--cycles N] [--memory-minutes M]
After the timings it runs bench/bench_memory.py (the agent's RSS on the demo) unless --memory-minutes 0.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from rooflight.collectors import expfmt, vllm  # noqa: E402

DEFAULT_PAGE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "engine-samples" / "vllm-cpu-load-c16.prom"
WINDOWS = {"10s": 10.0, "1m": 60.0, "5m": 300.0}
PERCENTILES = ("50", "90", "99")  # the agent's default --percentiles
IDLE_S = 0.1  # (c*): asleep between cycles as the agent is at 10 Hz
# (a) and (b) are pure CPU work: timed in this process's CPU seconds, which a busy machine's other
# work does not inflate the way it inflates wall time (the two are equal on an idle machine).
CLOCK = time.process_time

# How the pages move: per simulated second every cumulative value (counter, histogram bucket/_count/
# _sum, summary _count/_sum) grows by STEP of its recorded value times a load factor drawn from LOAD,
# so histograms keep their recorded shape and each second brings new observations into them.
STEP = 0.02
LOAD = (0.5, 1.5)
SEED = 20
KV_USAGE = "vllm:kv_cache_usage_perc"  # the one gauge moved (with the load), so its mean is not flat
_CUMULATIVE = {"counter": ("_total", ""), "histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum")}


# --- moving pages -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Moving:
    """One sample line whose value moves: the text before the value, the recorded value, how it moves."""

    head: str
    value: float
    kind: str  # "count" (a whole number: rounded), "float" (a _sum, seconds) or "kv" (the KV gauge)


def page_template(text: str) -> list[str | _Moving]:
    """The page's lines, with those whose values move marked; everything else (labels, HELP, TYPE,
    `_created`, gauges) is kept byte for byte."""
    out: list[str | _Moving] = []
    family_type = ""
    for line in text.split("\n"):
        if line.startswith("# TYPE "):
            parts = line.split()
            family_type = parts[3] if len(parts) >= 4 else ""
        moving = None if line.startswith("#") or not line.strip() else _moving(line, family_type)
        out.append(line if moving is None else moving)
    return out


def _moving(line: str, family_type: str) -> _Moving | None:
    brace = line.find("{")
    end = line.rfind("}") + 1 if brace != -1 else line.find(" ")
    if end <= 0:
        return None
    head, rest = line[:end], line[end:].split()
    name = head[:brace] if brace != -1 else head
    if len(rest) != 1:  # a timestamp after the value: leave the line alone
        return None
    try:
        value = float(rest[0])
    except ValueError:
        return None
    if name == KV_USAGE:
        return _Moving(head, value, "kv")
    suffixes = _CUMULATIVE.get(family_type, ())
    if name.endswith("_created") or not any(name.endswith(s) for s in suffixes):
        return None
    return _Moving(head, value, "float" if name.endswith("_sum") or not value.is_integer() else "count")


def render(template: Sequence[str | _Moving], growth: float, load: float) -> str:
    """The page after cumulative values grew by `growth` (x recorded) at the current `load`."""
    lines = []
    for item in template:
        if isinstance(item, str):
            lines.append(item)
            continue
        if item.kind == "count":
            value = float(round(item.value * growth))  # round is monotonic: buckets stay cumulative
        elif item.kind == "float":
            value = item.value * growth
        else:
            value = min(1.0, item.value * load)
        lines.append(f"{item.head} {value!r}")
    return "\n".join(lines)


def moving_pages(text: str, count: int, seed: int = SEED) -> Iterator[str]:
    """`count` pages, one per simulated second, counters advancing from the recorded page's values."""
    template, rng, growth = page_template(text), random.Random(seed), 1.0
    for _ in range(count):
        load = rng.uniform(*LOAD)
        growth += STEP * load
        yield render(template, growth, load)


# --- what is timed --------------------------------------------------------------------------------------


def pc_full(text: str) -> int:
    """(a) prometheus_client's parser over the whole page; the number of samples."""
    return sum(len(family.samples) for family in text_string_to_metric_families(text))


def ours_full(text: str) -> int:
    """(b) expfmt over the whole page, no filter; the number of samples."""
    return len(expfmt.parse(text))


def pc_kept(text: str) -> int:
    """(a') prometheus_client's parser, then only the samples the vLLM adapter reads."""
    keep = vllm.NAMES
    return len([s for family in text_string_to_metric_families(text) for s in family.samples if s.name in keep])


def ours_kept(text: str) -> int:
    """(b') the vLLM adapter: filtered parse and normalization; the number of series out."""
    return len(vllm.parse(text, target="bench", timestamp=0.0, duration=0.0).series)


def ours_kept_parse(text: str) -> int:
    """expfmt.select with the adapter's names, no normalization (what vllm.parse reads its page with)."""
    return sum(len(samples) for samples in expfmt.select(text, vllm.NAMES, prefixes=("vllm:",)).by_name.values())


def ours_kept_grouped(text: str) -> int:
    """expfmt.parse with the same filter: every line stepped through, families grouped (select's yardstick)."""
    return len(expfmt.parse(text, prefixes=("vllm:",), names=vllm.NAMES))


TIMED: dict[str, Callable[[str], int]] = {
    "pc_full": pc_full,
    "ours_full": ours_full,
    "pc_kept": pc_kept,
    "ours_kept": ours_kept,
    "ours_kept_parse": ours_kept_parse,
    "ours_kept_grouped": ours_kept_grouped,
}


def warm(fns: Sequence[Callable[[str], int]], pages: Sequence[str], number: int, rounds: int) -> list[float]:
    """Median CPU seconds per call of each fn, rounds interleaved, each call on the next page.

    One untimed pass over the pages first, so each fn has seen every label set (the steady state:
    an engine's label sets are stable between scrapes, its values are not)."""
    for fn in fns:
        for page in pages:
            fn(page)
    per: list[list[float]] = [[] for _ in fns]
    at = 0
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            batch = [pages[(at + k) % len(pages)] for k in range(number)]
            t0 = CLOCK()
            for page in batch:
                fn(page)
            per[i].append((CLOCK() - t0) / number)
        at += number
    return [statistics.median(p) for p in per]


def after_idle(fn: Callable[[str], int], pages: Sequence[str], idle: float) -> float:
    """Median CPU seconds per call of fn, each call after `idle` seconds asleep (its pages seen once before)."""
    for page in pages:
        fn(page)
    times = []
    for page in pages:
        time.sleep(idle)
        t0 = CLOCK()
        fn(page)
        times.append(CLOCK() - t0)
    return statistics.median(times)


def cold(name: str, page_file: Path, runs: int) -> float:
    """Median over `runs` fresh processes of the CPU seconds the first call of TIMED[name] takes."""
    times = []
    for run in range(runs):
        out = subprocess.run(
            [sys.executable, __file__, "--cold-child", name, "--file", str(page_file), "--page", str(run + 1)],
            check=True, capture_output=True, text=True,
        )
        times.append(float(out.stdout.split()[-1]))
    return statistics.median(times)


def cold_child(name: str, page_file: Path, page: int) -> None:
    """In a fresh process: build moving page `page`, then time the first call of TIMED[name] on it."""
    text = list(moving_pages(page_file.read_text(), page))[-1]
    fn = TIMED[name]
    t0 = CLOCK()
    fn(text)
    print(f"{CLOCK() - t0:.9f}")


# --- the full cycle ------------------------------------------------------------------------------------


def _serve(text: str, count: int, port_out: Any) -> None:
    """Child process: serve the next of `count` moving pages at /metrics on 127.0.0.1 until killed."""
    from aiohttp import web

    bodies = [page.encode() for page in moving_pages(text, count)]
    served = 0

    async def metrics(_: web.Request) -> web.Response:
        nonlocal served
        body = bodies[min(served, len(bodies) - 1)]
        served += 1
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
    """rooflight.agent.signals.derive.derive_window over WINDOWS, fed from one history per series, if the agent side
    is importable (the agent's derive step, signals/series.py, calls it the same way, shortest window first)."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.last: tuple[Any, ...] = ()  # the window results of the latest cycle, over every series
        try:
            from rooflight.agent.signals import derive
            from rooflight.agent.signals import windows

            self._derive, self._windows = derive, windows
        except Exception as exc:  # noqa: BLE001 - any import failure means "not available yet"
            self.error = f"{type(exc).__name__}: {exc}"
            return
        self.histories: dict[tuple[str, str], Any] = {}
        self.constants = _constants()

    def __call__(self, sample: vllm.EngineSample, t: float) -> None:
        """Append and derive; the results are kept in `last`."""
        if self.error is not None:
            return
        out: list[Any] = []
        try:
            for series in sample.series:
                key = (series.model, series.rank)
                history = self.histories.get(key)
                if history is None:
                    history = self.histories[key] = self._windows.SeriesHistory(retention=330.0)
                history.append(t, *self._derive.history_inputs(series))
                for name, seconds in sorted(WINDOWS.items(), key=lambda kv: kv[1]):
                    values = self._derive.derive_window(history, name, seconds, self.constants,
                                                        series.kv_capacity_tokens, PERCENTILES)
                    if values is not None:
                        out.append(values)
        except Exception as exc:  # noqa: BLE001 - the agent side is still moving; report, do not crash
            self.error = f"{type(exc).__name__}: {exc}"
        self.last = tuple(out)


@dataclass
class Derived:
    """What the measured cycles derived: proof that rates and percentiles were computed, not skipped."""

    cycles: int = 0
    with_rates: int = 0  # cycles with a non-zero decode token rate in some window
    with_percentiles: int = 0  # cycles with TTFT and ITL percentiles in some window
    results: int = 0  # window results, all cycles

    def add(self, results: Sequence[Any]) -> None:
        self.cycles += 1
        self.results += len(results)
        self.with_rates += any(w.tokens_per_second.get("decode", 0.0) > 0 for w in results)
        self.with_percentiles += any(w.ttft and w.itl for w in results)


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


async def full_cycles(
    url: str, cycles: int, warmup: int, deriver: Deriver, idle: float = 0.0
) -> tuple[list[float], list[float], Derived]:
    """Run warmup + cycles fetch+parse+derive cycles (fake 1 s clock), `idle` seconds asleep after each (not
    timed); wall and CPU seconds of the measured ones."""
    import aiohttp

    walls, cpus, derived = [], [], Derived()
    async with aiohttp.ClientSession() as session:
        for i in range(warmup + cycles):
            w0, c0 = time.perf_counter(), time.process_time()
            async with session.get(url) as response:
                body = await response.read()
            text = body.decode("utf-8")
            sample = vllm.parse(text, target="bench", timestamp=float(i), duration=time.perf_counter() - w0)
            deriver(sample, float(i))
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            if i >= warmup:
                walls.append(wall)
                cpus.append(cpu)
                derived.add(deriver.last)
            if idle:
                await asyncio.sleep(idle)
    return walls, cpus, derived


# --- report -----------------------------------------------------------------------------------------------


def _row(label: str, cold_s: float, warm_s: float, base: tuple[float, float] | None = None) -> str:
    row = f"{label:<44} cold {cold_s * 1e3:7.3f} ms  warm {warm_s * 1e3:7.3f} ms"
    if base is not None:
        row += f"   ratio cold {cold_s / base[0]:.3f}  warm {warm_s / base[1]:.3f}"
    return row


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--file", type=Path, default=DEFAULT_PAGE)
    args.add_argument("--cycles", type=int, default=400, help="measured full cycles for (c), after 50 warm-up")
    args.add_argument("--number", type=int, default=20, help="calls per timed round, warm")
    args.add_argument("--rounds", type=int, default=7, help="timed rounds per measurement, warm")
    args.add_argument("--pages", type=int, default=40, help="distinct moving pages the warm calls cycle through")
    args.add_argument("--cold-runs", type=int, default=5, help="fresh processes per cold measurement")
    args.add_argument("--memory-minutes", type=float, default=6.0,
                      help="minutes of `rooflight run` on the demo at 1 Hz and at 10 Hz (0 skips; the 5m window"
                           " fills in the first 5)")
    args.add_argument("--cold-child", choices=sorted(TIMED), help=argparse.SUPPRESS)
    args.add_argument("--page", type=int, default=1, help=argparse.SUPPRESS)
    opts = args.parse_args(argv)
    if opts.cold_child:
        cold_child(opts.cold_child, opts.file, opts.page)
        return 0

    print("$ python bench/bench_sampling.py " + " ".join(sys.argv[1:] if argv is None else argv))
    text = opts.file.read_text()
    pages = list(moving_pages(text, opts.pages))
    print(f"page: {opts.file.name} ({len(text)} bytes, {text.count(chr(10))} lines); python {sys.version.split()[0]};"
          f" {opts.pages} moving pages (cumulative values +{STEP:.0%}/s x load {LOAD[0]}-{LOAD[1]})")
    full_n, kept_n = pc_full(pages[0]), pc_kept(pages[0])
    ours_n, ours_kept_n = ours_full(pages[0]), ours_kept_parse(pages[0])
    print(f"samples: full page {full_n} (ours {ours_n}); kept by the vLLM adapter {kept_n} (ours {ours_kept_n})")

    names = ["pc_full", "ours_full", "pc_kept", "ours_kept", "ours_kept_parse", "ours_kept_grouped"]
    colds = {name: cold(name, opts.file, opts.cold_runs) for name in names}
    warms = dict(zip(names, warm([TIMED[name] for name in names], pages, opts.number, opts.rounds)))
    a = (colds["pc_full"], warms["pc_full"])
    a_kept = (colds["pc_kept"], warms["pc_kept"])
    print(f"CPU time per call. cold: first call in a fresh process, median of {opts.cold_runs};"
          f" warm: median of {opts.rounds} rounds of {opts.number} calls, each on the next page")
    print("Full page, every family:")
    print(_row("(a)  prometheus_client parser", *a))
    print(_row("(b)  expfmt, no filter", colds["ours_full"], warms["ours_full"], a) + "   (b/a)")
    print(f"Families the vLLM adapter keeps ({kept_n} of {full_n} samples):")
    print(_row("(a') prometheus_client parser + same filter", *a_kept))
    print(_row("(b') vllm.parse: filtered parse + normalize", colds["ours_kept"], warms["ours_kept"], a_kept)
          + "   (b'/a', target <= 0.10)")
    print(_row("     of which the filtered read alone", colds["ours_kept_parse"], warms["ours_kept_parse"], a_kept)
          + "   (expfmt.select)")
    print(_row("     the same filter through expfmt.parse", colds["ours_kept_grouped"], warms["ours_kept_grouped"],
               a_kept) + "   (every line stepped through)")

    warmup = min(50, opts.cycles)
    idle_cycles = max(1, opts.cycles // 4)
    receive, send = multiprocessing.Pipe(duplex=False)
    server = multiprocessing.Process(target=_serve, args=(text, 2 * warmup + opts.cycles + idle_cycles, send),
                                     daemon=True)
    server.start()
    try:
        port = receive.recv()
        deriver = Deriver()
        walls, cpus, derived = asyncio.run(
            full_cycles(f"http://127.0.0.1:{port}/metrics", opts.cycles, warmup, deriver)
        )
        _, idle_cpus, _ = asyncio.run(
            full_cycles(f"http://127.0.0.1:{port}/metrics", idle_cycles, warmup, Deriver(), idle=IDLE_S)
        )
    finally:
        server.kill()
        server.join()
    c, c_cpu = statistics.median(walls), statistics.median(cpus)
    label = "(c)  fetch + parse + derive, warm" if deriver.error is None else "(c)  partial: derive not available"
    print(f"{label:<44} wall {c * 1e3:7.3f} ms  cpu {c_cpu * 1e3:7.3f} ms per cycle"
          f"   c/a wall {c / a[1]:.3f}  cpu {c_cpu / a[1]:.3f}   (a warm; target <= 0.25)")
    idle_cpu = statistics.median(idle_cpus)
    idle_a = after_idle(pc_full, pages[:30], IDLE_S)
    asleep = f"{IDLE_S * 1e3:.0f} ms asleep before each"
    print(f"{'(c*) the same cycle, ' + asleep:<44} {'':<15}cpu {idle_cpu * 1e3:7.3f} ms per cycle"
          f"   c*/c {idle_cpu / c_cpu:.2f}"
          f"   ({idle_cycles} cycles: what a tick costs at 10 Hz, its caches gone cold while it slept)")
    print(f"{'(a*) prometheus_client parser, ' + asleep:<44} {'':<15}cpu {idle_a * 1e3:7.3f} ms per call"
          f"    a*/a {idle_a / a[1]:.2f}   c*/a* {idle_cpu / idle_a:.3f}")
    if deriver.error is not None:
        print(f"     derive: {deriver.error}")
    else:
        consts = "with" if deriver.constants is not None else "without"
        print(f"     {derived.cycles} cycles after {warmup} warm-up, a new page each, fake 1 s clock, windows"
              f" {list(WINDOWS)}, {consts} model constants: decode rate > 0 in {derived.with_rates},"
              f" TTFT+ITL percentiles in {derived.with_percentiles} ({derived.results} window results)")
    if opts.memory_minutes > 0:
        sys.path.insert(0, str(Path(__file__).parent))
        import bench_memory

        bench_memory.report(opts.memory_minutes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
