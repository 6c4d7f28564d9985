"""What the accounting's SSE parser costs per byte, however the upstream cuts its lines.

Feeds the same number of bytes to `rooflight.agent.proxy.sse.SSEParser` in `--read`-byte reads, twice in
the same run: as short events (the baseline: what an engine sends) and as one line of `--mib` MiB (what a
hostile or odd upstream can send). A parser that re-joins the unfinished line on every read is quadratic
in the line's length; a linear one costs the long line about what the short lines cost. Printed: CPU
seconds (this thread's, best of `--rounds`) for each, and their ratio. Timing is printed, never asserted.

Run from the repository root:  python bench/bench_sse_feed.py [--mib 4] [--read 512] [--rounds 3]

`--chunks N` instead times the whole accounting of a stream (`RequestTracker.on_bytes`) over N vLLM-like token
chunks, one a read: as the proxy reads them (each chunk read by the stream's shape, sse.ChunkShape) and with
every chunk decoded (the way before it), alternating, best of `--rounds`; printed as microseconds of CPU a chunk.

`--long-text KIB` does the same with texts of that many KiB each (escaped, surrogate pairs, UTF-8, plain,
one bad byte at the end): the shape must never cost more than decoding, so each ratio should stay near 1x.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rooflight.agent.proxy import tracker as tr  # noqa: E402
from rooflight.agent.proxy.sse import SSEParser  # noqa: E402
from rooflight.agent.signals.token_gaps import ClientGaps  # noqa: E402

CHUNK = (b'data: {"id":"chatcmpl-3f2a9b1c8d7e4f60a1b2c3d4e5f60718","object":"chat.completion.chunk","created":1733000000,'
         b'"model":"Qwen/Qwen2.5-0.5B-Instruct","choices":[{"index":0,"delta":{"content":"%b"},"logprobs":null,'
         b'"finish_reason":null}]}\n\n')
WORDS = [b" the", b" model", b",", b" \\\"quoted\\\"", b"", " caf\u00e9".encode(), b"\\n", b" 42"]


def cpu_to_feed(data: bytes, read: int) -> float:
    pieces = [data[i:i + read] for i in range(0, len(data), read)]
    parser = SSEParser()
    start = time.thread_time()
    for piece in pieces:
        parser.feed(piece)
    return time.thread_time() - start


def cpu_to_account(reads: list[bytes], shapes: int) -> float:
    """CPU seconds the accounting of one stream takes for `reads` (`shapes`: how many chunk shapes it learns)."""
    saved, tr.MAX_SHAPES = tr.MAX_SHAPES, shapes
    try:
        tracker = tr.RequestTracker(0.0, "chat", None, ClientGaps(), tr.ByteBudget(64 << 20))
        tracker.on_response(200, "text/event-stream")
        start = time.thread_time()
        for i, data in enumerate(reads):
            tracker.on_bytes(i * 0.01, data)
        return time.thread_time() - start
    finally:
        tr.MAX_SHAPES = saved


def chunks(n: int, rounds: int) -> int:
    reads = [CHUNK % WORDS[i % len(WORDS)] for i in range(n)]
    shaped = decoded = float("inf")
    for _ in range(rounds):
        shaped = min(shaped, cpu_to_account(reads, tr.MAX_SHAPES))
        decoded = min(decoded, cpu_to_account(reads, 0))
    print(f"bench_sse_feed: the accounting of {n} token chunks, one a read, best of {rounds}")
    print(f"each chunk decoded:      {decoded / n * 1e6:6.2f} us CPU a chunk")
    print(f"read by the chunk shape: {shaped / n * 1e6:6.2f} us CPU a chunk  ({shaped / decoded:.2f}x)")
    print(json.dumps({"decoded_us": decoded / n * 1e6, "shaped_us": shaped / n * 1e6}))
    return 0


LONG_TEXTS = {"escaped": b"\\n", "surrogate pairs": b"\\ud83d\\ude00", "utf-8": " caf\u00e9".encode(),
              "plain": b" the model"}


def long_texts(kib: float, n: int, rounds: int) -> int:
    print(f"bench_sse_feed: the accounting of {n} token chunks with {kib:g} KiB texts, one a read, best of {rounds}")
    result = {}
    for name, unit in LONG_TEXTS.items():
        for bad in (b"", b"\x01"):
            text = unit * int(kib * 1024 / len(unit)) + bad
            reads = [CHUNK % b"a"] + [CHUNK % text] * n
            shaped = decoded = float("inf")
            for _ in range(rounds):
                shaped = min(shaped, cpu_to_account(reads, tr.MAX_SHAPES))
                decoded = min(decoded, cpu_to_account(reads, 0))
            label = name + (" + a bad byte" if bad else "")
            print(f"{label:28} decoded {decoded / n * 1e6:9.1f} us a chunk, shaped {shaped / n * 1e6:9.1f}"
                  f"  ({shaped / decoded:.2f}x)")
            result[label] = shaped / decoded
    print(json.dumps(result))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=float, default=4.0, help="bytes fed each way, in MiB (the long line's length)")
    ap.add_argument("--read", type=int, default=512, help="bytes per read")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunks", type=int, default=0, help="time the accounting of this many token chunks instead")
    ap.add_argument("--long-text", type=float, default=0, help="with --chunks: texts of this many KiB each")
    args = ap.parse_args()
    if args.long_text:
        return long_texts(args.long_text, args.chunks or 50, args.rounds)
    if args.chunks:
        return chunks(args.chunks, args.rounds)
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
