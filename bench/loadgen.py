"""Bounded streaming load against an OpenAI-compatible server, counted from the client side.

Owns the client's view of a load run, which the real-engine tests hold the agent to: how many prompt
and completion tokens the server said it processed (the streamed `usage` fields, with
continuous_usage_stats so every chunk says how many tokens it carried), and the client-side TTFT
(request sent -> first content chunk) and ITL (gap between chunks, split evenly over the tokens a
chunk carried). It stops by itself: a fixed number of requests, a per-request and an overall
timeout. Only stdlib and aiohttp.

usage: python bench/loadgen.py --url http://127.0.0.1:8000 --requests 32 --concurrency 8 \
           --max-tokens 128 --prompt-words 40 [--chat-every 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field

import aiohttp

WORDS = (
    "prefill decode step ridge intensity occupancy preemption token batch cache model "
    "the quick brown fox jumps over the lazy dog licence software program terms"
).split()


@dataclass(frozen=True)
class LoadSpec:
    url: str  # http://127.0.0.1:PORT
    requests: int = 16
    concurrency: int = 4
    max_tokens: int = 64
    prompt_words: int = 30
    chat_every: int = 0  # every k-th request goes to /v1/chat/completions; 0 = never
    model: str = "tiny-llama"
    request_timeout_s: float = 300.0
    total_timeout_s: float = 600.0
    seed: int = 0


@dataclass
class RequestResult:
    index: int
    status: int | str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float = 0.0
    started: float = 0.0  # time.time()
    ended: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.completion_tokens > 0


@dataclass
class LoadReport:
    spec: LoadSpec
    results: list[RequestResult]
    started: float  # time.time() of the first request
    ended: float  # time.time() when the last one finished

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.ok)

    @property
    def completion_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.ok)

    def ttfts(self) -> list[float]:
        return sorted(r.ttft_s for r in self.ok if r.ttft_s is not None)

    def itls(self) -> list[float]:
        return sorted(x for r in self.ok for x in r.itl_s)

    def summary(self) -> dict:
        return {
            "requests": len(self.results), "ok": len(self.ok),
            "errors": [r.status for r in self.results if not r.ok][:5],
            "wall_s": round(self.ended - self.started, 3),
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "ttft_p50_s": percentile(self.ttfts(), 0.5), "ttft_p90_s": percentile(self.ttfts(), 0.9),
            "itl_p50_s": percentile(self.itls(), 0.5), "itl_p90_s": percentile(self.itls(), 0.9),
        }


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 1))))
    return sorted_values[rank - 1]


def prompt_for(spec: LoadSpec, index: int) -> str:
    rnd = random.Random(spec.seed * 1_000_003 + index)
    return " ".join(rnd.choice(WORDS) for _ in range(spec.prompt_words))


def request_body(spec: LoadSpec, index: int) -> tuple[str, dict]:
    prompt = prompt_for(spec, index)
    common = {
        "model": spec.model, "max_tokens": spec.max_tokens, "stream": True, "ignore_eos": True,
        "temperature": 1.0, "seed": index,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if spec.chat_every and index % spec.chat_every == 0:
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", {**common, "prompt": prompt}


def _absorb_chunk(res: RequestResult, chunk: dict, now: float, t0: float, last: list[float]) -> None:
    """Fold one streamed chunk into res. With continuous usage stats a chunk's token count is the
    rise of usage.completion_tokens; a chunk carrying k tokens adds k gaps of (gap / k)."""
    usage = chunk.get("usage") or {}
    before = res.completion_tokens
    if usage:
        res.prompt_tokens = int(usage.get("prompt_tokens") or res.prompt_tokens)
        res.completion_tokens = int(usage.get("completion_tokens") or res.completion_tokens)
    if not chunk.get("choices"):
        return  # the final usage-only chunk
    carried = res.completion_tokens - before if usage else 1
    if carried <= 0:
        return  # e.g. the chat role-only first chunk: no token yet
    if res.ttft_s is None:
        res.ttft_s = now - t0
        res.itl_s.extend([0.0] * (carried - 1))  # arrived together with the first token
    else:
        res.itl_s.extend([(now - last[0]) / carried] * carried)
    last[:] = [now]


async def one_request(http: aiohttp.ClientSession, spec: LoadSpec, index: int) -> RequestResult:
    path, body = request_body(spec, index)
    res = RequestResult(index=index, started=time.time())
    t0 = time.perf_counter()
    last: list[float] = []
    try:
        async with http.post(spec.url + path, json=body,
                             timeout=aiohttp.ClientTimeout(total=spec.request_timeout_s)) as r:
            res.status = r.status
            async for raw in r.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                _absorb_chunk(res, json.loads(line[6:]), time.perf_counter(), t0, last)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        res.status = f"{type(e).__name__}: {e}"
    res.e2e_s = time.perf_counter() - t0
    res.ended = time.time()
    return res


async def run_load(spec: LoadSpec) -> LoadReport:
    """Send spec.requests streaming requests, at most spec.concurrency at a time; never raises on
    a failed request (it is recorded), stops at spec.total_timeout_s whatever happens."""
    sem = asyncio.Semaphore(spec.concurrency)
    conn = aiohttp.TCPConnector(limit=spec.concurrency + 2, force_close=True)
    started = time.time()
    async with aiohttp.ClientSession(connector=conn) as http:
        async def guarded(i: int) -> RequestResult:
            async with sem:
                return await one_request(http, spec, i)

        tasks = [asyncio.create_task(guarded(i)) for i in range(spec.requests)]
        done, pending = await asyncio.wait(tasks, timeout=spec.total_timeout_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    results = [t.result() for t in done if not t.cancelled() and t.exception() is None]
    results += [RequestResult(index=-1, status="total timeout") for _ in pending]
    return LoadReport(spec=spec, results=sorted(results, key=lambda r: r.index),
                      started=started, ended=time.time())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-words", type=int, default=30)
    p.add_argument("--chat-every", type=int, default=0)
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--total-timeout", type=float, default=600.0)
    p.add_argument("--json", help="write summary and per-request results here")
    a = p.parse_args(argv)
    spec = LoadSpec(url=a.url.rstrip("/"), requests=a.requests, concurrency=a.concurrency,
                    max_tokens=a.max_tokens, prompt_words=a.prompt_words, chat_every=a.chat_every,
                    model=a.model, total_timeout_s=a.total_timeout)
    report = asyncio.run(run_load(spec))
    print(json.dumps(report.summary(), indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": report.summary(), "results": [asdict(r) for r in report.results]}, f)
    return 0 if len(report.ok) == spec.requests else 1


if __name__ == "__main__":
    sys.exit(main())
