"""A real llama.cpp `llama-server --metrics` on CPU, scraped by the real agent (`rooflight run`, auto-detect).

Needs ROOFLIGHT_LLAMACPP_DIR: the cache directory `.ci/llamacpp.sh` prints (built llama-server in
bin/, llama.cpp's gguf-py in gguf-py/, a venv whose python has numpy for it). Without it this test fails
on purpose: it runs only when asked for (-m real_engine), and a skipped real-engine stage would look like
a passing one.

One llama-server (2 slots) serves a tiny random GGUF made here; the agent watches it every 0.2 s;
a load (24 completions or more, 4 at a time, 192 tokens each, EOS ignored) runs while the agent's
/metrics is polled. Checked: the engine is recognised as llamacpp; what the agent exports equals
llama-server's own counters and the clients' token counts; the running and deferred requests
show up; the batch cap comes from `/props` (total_slots); and nothing is exported for what llama.cpp
cannot say (KV occupancy, TTFT, ITL, preemptions). Every process is stopped by PID (the `started`
fixture checks none is left).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rooflight.collectors import expfmt
from procs import ManagedProcess, free_port, http_text
from support import rooflight_exe

HERE = Path(__file__).resolve().parent
REQUESTS, CONCURRENCY, MAX_TOKENS, SLOTS = 24, 4, 192, 2
MORE_S = 60.0  # how long the load goes on past REQUESTS while no deferred request was seen


@pytest.fixture(scope="module")
def llamacpp_dir() -> Path:
    d = os.environ.get("ROOFLIGHT_LLAMACPP_DIR")
    if not d or not (Path(d) / "bin" / "llama-server").exists():
        pytest.fail("ROOFLIGHT_LLAMACPP_DIR does not hold bin/llama-server: run .ci/llamacpp.sh --test")
    return Path(d)


@pytest.fixture(scope="module")
def tiny_gguf(llamacpp_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-gguf")
    env = {**os.environ, "PYTHONPATH": str(llamacpp_dir / "gguf-py")}
    python = llamacpp_dir / "venv" / "bin" / "python"  # has numpy and PyYAML for gguf-py
    subprocess.run([str(python), str(HERE / "make_tiny_gguf.py"), str(out)], env=env, check=True,
                   capture_output=True, timeout=120)
    return out


def _complete(url: str, i: int) -> int:
    body = json.dumps({"prompt": f"request {i}: the answer is in the", "max_tokens": MAX_TOKENS,
                       "ignore_eos": True, "temperature": 0.8, "stream": False}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return int(json.load(r)["usage"]["completion_tokens"])


def _values(text: str, name: str, target: str | None = None) -> list[float]:
    return [s.value for s in expfmt.parse(text).get(name) if target is None or s.labels.get("target") == target]


def _rates(text: str) -> dict[str, float]:
    """rooflight_tokens_per_second{window="1m"} by phase: the load (a second or two) stays in it for a minute,
    where a host stall of a few seconds could take it out of the 10 s window before that one is exported."""
    return {s.labels["phase"]: s.value for s in expfmt.parse(text).get("rooflight_tokens_per_second")
            if s.labels.get("window") == "1m"}


def test_agent_reads_a_real_llama_server(llamacpp_dir: Path, tiny_gguf: Path, tmp_path: Path,
                                         started: list[ManagedProcess]) -> None:
    eport, aport = free_port(), free_port()
    server = ManagedProcess(
        name="llama-server", port=eport, log_path=tmp_path / "llama-server.log",
        argv=[str(llamacpp_dir / "bin" / "llama-server"), "-m", str(tiny_gguf / "tiny-llama-f32.gguf"),
              "--host", "127.0.0.1", "--port", str(eport), "--metrics", "-c", "2048", "-np", str(SLOTS), "-t", "2"],
    )
    started.append(server.start())
    server.wait_http(f"http://127.0.0.1:{eport}/health", timeout=60)
    engine = f"http://127.0.0.1:{eport}"
    target = f"127.0.0.1:{eport}"

    agent = ManagedProcess(
        name="agent-llamacpp", port=aport, log_path=tmp_path / "agent.log", env_drop_prefixes=("ROOFLIGHT_",),
        argv=[rooflight_exe(), "run", "--engine-url", engine,
              "--model-config", str(tiny_gguf / "config.json"), "--gpu", "h100-sxm",
              "--listen", f"127.0.0.1:{aport}", "--interval", "0.2", "--windows", "10s,1m", "--no-nvml"],
    )
    started.append(agent.start())
    agent.wait_http(f"http://127.0.0.1:{aport}/-/ready", timeout=30)
    metrics = f"http://127.0.0.1:{aport}/metrics"

    seen_running, seen_waiting = [], []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            try:
                text = http_text(metrics)
            except OSError:  # a page late past the timeout on a stalled host: the next poll
                time.sleep(0.1)
                continue
            seen_running.extend(_values(text, "rooflight_requests_running", target))
            seen_waiting.extend(_values(text, "rooflight_requests_waiting", target))
            time.sleep(0.1)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    t0 = time.monotonic()
    sent = itertools.count()

    def client() -> list[int]:
        """Completions one after another: REQUESTS in all, then on (up to MORE_S) until the agent was seen
        with a deferred request. On a busy machine the whole load once ran between two of the agent's pages."""
        tokens = []
        while (i := next(sent)) < REQUESTS or (max(seen_waiting, default=0) < 1 and time.monotonic() < t0 + MORE_S):
            tokens.append(_complete(engine, i))
        return tokens

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        answers = [n for tokens in pool.map(lambda _: client(), range(CONCURRENCY)) for n in tokens]
    load_s = time.monotonic() - t0
    completion_tokens = sum(answers)
    done.set()
    poller.join(timeout=10)

    # The agent's next samples catch up with the engine's counters, which no longer move.
    own = expfmt.parse(http_text(engine + "/metrics"))
    predicted = own.get("llamacpp:tokens_predicted_total")[0].value
    decodes = own.get("llamacpp:n_decode_total")[0].value
    prompt = own.get("llamacpp:prompt_tokens_total")[0].value
    deadline = time.monotonic() + 60
    while True:
        text = http_text(metrics)
        if _values(text, "rooflight_generation_tokens_total", target) == [predicted] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    print(f"\n[llamacpp] load {len(answers)}x{MAX_TOKENS} tokens in {load_s:.2f}s; "
          f"max running {max(seen_running, default=None)},"
          f" max waiting {max(seen_waiting, default=None)}; engine ready after {server.ready_after_s:.2f}s")

    assert 'engine="llamacpp"' in text
    assert len(answers) >= REQUESTS and completion_tokens == len(answers) * MAX_TOKENS
    assert predicted == completion_tokens
    assert _values(text, "rooflight_generation_tokens_total", target) == [predicted]
    assert _values(text, "rooflight_prompt_tokens_total", target) == [prompt] and prompt > 0
    assert _values(text, "rooflight_engine_steps_total", target) == [decodes] and decodes >= MAX_TOKENS
    assert seen_running and 1 <= max(seen_running) <= SLOTS
    assert max(seen_waiting) >= 1  # 4 clients, 2 slots: llama-server defers the rest
    # A window is exported once the agent's own samples span half of it: 30 s for the 1 m window.
    deadline = time.monotonic() + 90
    while not (rates := _rates(text)) and time.monotonic() < deadline:
        time.sleep(0.5)
        text = http_text(metrics)
    assert rates.get("decode", 0) > 0 and rates.get("prefill", 0) > 0, rates
    # the window holds the whole load (the agent's first sample was before it): no more than its tokens
    assert rates["decode"] * 30 <= completion_tokens
    for absent in ("rooflight_kv_cache_usage_ratio", "rooflight_kv_cache_capacity_tokens", "rooflight_ttft_seconds",
                   "rooflight_itl_seconds", "rooflight_preemptions_total"):
        assert not _values(text, absent, target), f"{absent} exported for llama.cpp, which cannot say it"
    assert f'rooflight_source_up{{source="engine",target="{target}"}} 1.0' in text
    # /metrics has no batch cap; /props total_slots (the llama.cpp adapter's parse_info) supplies it.
    assert _values(text, "rooflight_batch_max_requests", target) == [float(SLOTS)]

    agent.stop()
    server.stop()
    assert not agent.leftovers() and not server.leftovers()
