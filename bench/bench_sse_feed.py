"""What the accounting's SSE parser costs per byte, however the upstream cuts its lines.

Feeds the same number of bytes to `rooflight.agent.proxy.sse.SSEParser` in `--read`-byte reads, twice in
the same run: as short events (the baseline: what an engine sends) and as one line of `--mib` MiB (what a
hostile or odd upstream can send). A parser that re-joins the unfinished line on every read is quadratic
in the line's length; a linear one costs the long line about what the short lines cost. Printed: CPU
seconds (this thread's, best of `--rounds`) for each, and their ratio. Timing is printed, never asserted.

Run from the repository root:  python bench/bench_sse_feed.py [--mib 4] [--read 512] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rooflight.agent.proxy.sse import SSEParser  # noqa: E402


def cpu_to_feed(data: bytes, read: int) -> float:
    pieces = [data[i:i + read] for i in range(0, len(data), read)]
    parser = SSEParser()
    start = time.thread_time()
    for piece in pieces:
        parser.feed(piece)
    return time.thread_time() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=float, default=4.0, help="bytes fed each way, in MiB (the long line's length)")
    ap.add_argument("--read", type=int, default=512, help="bytes per read")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    size = int(args.mib * 1024 * 1024)
    short = b"data: " + b"y" * 120 + b"\n\n"
    short_lines = short * (size // len(short))
    long_line = b"data: " + b"x" * (size - 8) + b"\n\n"
    baseline = min(cpu_to_feed(short_lines, args.read) for _ in range(args.rounds))
    long = min(cpu_to_feed(long_line, args.read) for _ in range(args.rounds))
    print(f"bench_sse_feed: {args.mib:g} MiB in {args.read}-byte reads, best of {args.rounds}")
    print(f"short events (baseline): {baseline * 1e3:8.1f} ms CPU")
    print(f"one {args.mib:g} MiB line:      {long * 1e3:8.1f} ms CPU  ({long / baseline:.2f}x the baseline)")
    print(json.dumps({"short_ms": baseline * 1e3, "long_line_ms": long * 1e3, "ratio": long / baseline}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
