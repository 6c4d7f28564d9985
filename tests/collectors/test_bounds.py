"""What one engine page may cost the agent: samples, labels, label length, body size, memory
(docs/reliability.md "Bounds on what an engine can cost").

Before: a 7-16 MB page of 200k-260k series took the agent to 220-381 MB and 6.8 s per sample, and one
15 MB `model_name` made /metrics 126 MB.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

import aiohttp
import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rooflight.agent.metrics.exposition import registry_for
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import build, env_settings
from rooflight.agent.sampling.sampler import Agent
from rooflight.collectors import expfmt
from rooflight.collectors.common import LABELS_PER_SAMPLE, MIN_PAGE_SAMPLES, SAMPLES_PER_SERIES, page_bounds
from rooflight.collectors.errors import ParseError, SourceError
from rooflight.collectors.http import DEFAULT_MAX_BODY_BYTES, fetch_text
from support import SAMPLES, FakeEngine, free_port, sample_text, started_agent

PAGE = sample_text("vllm-cpu-load-c16.prom")
RUNNING = "vllm:num_requests_running"
MAX_RSS = 100e6  # bytes, for any page the agent accepts (the shipped memory limit is 256Mi)


def _lines(n: int, labels: str = "") -> str:
    return "".join(f'{RUNNING}{{engine="{i}",model_name="m"{labels}}} {i}\n' for i in range(n))


# -- the reader's bounds -----------------------------------------------------------------------------------


def test_the_sample_cap_applies_while_parsing_and_counts_what_it_did_not_read() -> None:
    bounds = expfmt.Bounds(max_samples=10)
    exp = expfmt.parse(_lines(25), names={RUNNING}, bounds=bounds)
    assert len(exp) == 10 and exp.samples_dropped == 15
    assert [s.value for s in exp.get(RUNNING)] == [float(i) for i in range(10)]  # page order, the rest unread
    assert (bounds.samples, bounds.samples_dropped) == (10, 15)
    again = expfmt.parse(_lines(3), bounds=bounds)  # one scrape's bounds hold over every parse call in it
    assert len(again) == 0 and (bounds.samples, bounds.samples_dropped) == (10, 18)
    # filtered-out lines cost nothing against the cap
    other = expfmt.parse(_lines(5) + "vllm:other 1\n" * 50, names={RUNNING}, bounds=expfmt.Bounds(max_samples=5))
    assert len(other) == 5 and other.samples_dropped == 0


def test_the_label_cap_stops_samples_that_carry_many_labels() -> None:
    many = "".join(f',l{j}="{j}"' for j in range(40))
    bounds = expfmt.Bounds(max_samples=1000, max_labels=100)
    exp = expfmt.parse(_lines(10, many), bounds=bounds)
    created = len(exp)
    assert 1 <= created < 10 and exp.samples_dropped == 10 - created
    assert bounds.labels == created * 42 and bounds.labels - 42 < 100


def test_the_bounds_follow_the_scrape_into_a_worker_thread() -> None:
    async def main() -> expfmt.Bounds:
        with expfmt.bounded(expfmt.Bounds(max_samples=4)) as bounds:
            await asyncio.to_thread(expfmt.parse, _lines(9))
        return bounds

    bounds = asyncio.run(main())
    assert (bounds.samples, bounds.samples_dropped) == (4, 5)
    assert expfmt.parse(_lines(9)).samples_dropped == 0  # outside the context: no bounds


def test_long_label_values_are_cut_with_a_marker_and_counted() -> None:
    huge = "x" * 1_000_000
    text = f'{RUNNING}{{engine="0",model_name="{huge}"}} 1\n{RUNNING}{{engine="1",model_name="ok"}} 2\n'
    bounds = expfmt.Bounds()
    exp = expfmt.parse(text, bounds=bounds)
    first, second = exp.get(RUNNING)
    assert first.labels["model_name"] == "x" * expfmt.MAX_LABEL_VALUE_CHARS + expfmt.TRUNCATED_MARK
    assert second.labels["model_name"] == "ok"
    assert exp.labels_truncated == bounds.labels_truncated == 1
    # an escaped or spaced value takes the slow path: cut the same way
    slow = expfmt.parse(f'{RUNNING}{{ model_name = "a\\"{huge}" }} 1\n', bounds=expfmt.Bounds())
    cut = 'a"' + "x" * (expfmt.MAX_LABEL_VALUE_CHARS - 2) + expfmt.TRUNCATED_MARK
    assert slow.get(RUNNING)[0].labels["model_name"] == cut
    assert slow.labels_truncated == 1
    # without bounds the reader stays exact, and the series cache never hands one reading to the other
    assert expfmt.parse(text).get(RUNNING)[0].labels["model_name"] == huge
    again = expfmt.parse(text, bounds=expfmt.Bounds()).get(RUNNING)[0]
    assert again.labels["model_name"].endswith(expfmt.TRUNCATED_MARK)


def test_a_page_read_in_blocks_reads_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = expfmt.parse(PAGE)
    monkeypatch.setattr(expfmt, "_BLOCK_CHARS", 97)  # many blocks, cut anywhere
    blocks = expfmt.parse(PAGE)
    assert [(f.name, f.type, f.help, f.samples) for f in blocks.families] == [
        (f.name, f.type, f.help, f.samples) for f in whole.families
    ]
    assert blocks.bad_lines == whole.bad_lines == 0
    assert expfmt.parse(PAGE.rstrip("\n")).by_name == whole.by_name  # no final newline


_LINE = st.one_of(
    st.builds(lambda i, v: f'{RUNNING}{{engine="{i}",model_name="m"}} {v}', st.integers(0, 50), st.integers(0, 9)),
    st.builds(lambda i: f"vllm:other{{a=\"{i}\"}} 1", st.integers(0, 50)),
    st.just("# TYPE vllm:num_requests_running gauge"),
    st.just("# HELP vllm:other odd"),
    st.just("garbage {"),
    st.just(""),
)


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(_LINE, max_size=60), block=st.integers(1, 200), cap=st.integers(0, 40))
def test_blocks_and_caps_change_nothing_but_what_the_caps_cut(lines: list[str], block: int, cap: int) -> None:
    text = "\n".join(lines) + "\n"
    whole = _read(text)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(expfmt, "_BLOCK_CHARS", block)
        blocks = _read(text)
        bounded = _read(text, names={RUNNING}, bounds=expfmt.Bounds(max_samples=cap))
    assert (blocks is None) == (whole is None)
    if whole is None or blocks is None:
        return
    assert [(s.name, s.labels, s.value) for f in blocks.families for s in f.samples] == [
        (s.name, s.labels, s.value) for f in whole.families for s in f.samples
    ]
    wanted = whole.get(RUNNING)
    assert bounded is not None
    assert bounded.get(RUNNING) == wanted[:cap]
    assert bounded.samples_dropped == max(0, len(wanted) - cap)


def _read(text: str, **kw: object) -> expfmt.Exposition | None:
    try:
        return expfmt.parse(text, **kw)  # type: ignore[arg-type]
    except ParseError:
        return None


def test_the_series_cache_is_bounded_in_characters() -> None:
    long_name = "m" * 100
    expfmt.parse("".join(f'{RUNNING}{{engine="{i}",model_name="{long_name}"}} 1\n' for i in range(40_000)))
    assert len(expfmt._SERIES) <= expfmt._SERIES_MAX
    assert sum(len(k) for k in expfmt._SERIES) <= expfmt._SERIES_CHARS_MAX
    assert expfmt._series_chars == sum(len(k) for k in expfmt._SERIES)


def test_every_real_page_reads_whole_under_the_agents_bounds() -> None:
    """The bounds cut nothing on a real page, even at max_series 1."""
    for path in sorted(SAMPLES.glob("*.prom")):
        bounds = page_bounds(1)
        exp = expfmt.parse(path.read_text(), bounds=bounds)
        assert (exp.samples_dropped, exp.labels_truncated) == (0, 0), path.name
        assert exp.by_name == expfmt.parse(path.read_text()).by_name, path.name
    assert page_bounds(128).max_samples == SAMPLES_PER_SERIES * 128 > MIN_PAGE_SAMPLES
    assert page_bounds(128).max_labels == LABELS_PER_SAMPLE * SAMPLES_PER_SERIES * 128


# -- the default body cap ------------------------------------------------------------------------------------


def _rank_bytes(text: str) -> int:
    """Bytes of the vLLM lines that one data-parallel rank adds (they carry engine="0")."""
    return sum(len(line) + 1 for line in text.splitlines() if 'engine="0"' in line)


def test_the_default_body_cap_holds_the_largest_real_page_with_room() -> None:
    pages = [sample_text(p.name) for p in SAMPLES.glob("vllm-*.prom")]
    assert len(pages) >= 3
    per_rank = max(_rank_bytes(t) for t in pages)
    once = max(len(t) - _rank_bytes(t) for t in pages)
    lines = max(sum('engine="0"' in line for line in t.splitlines()) for t in pages)
    model_name = len("tiny-llama")
    per_rank_named = per_rank + lines * (40 - model_name)  # a 40-character model name
    lora_sets = 1000 * 400  # a thousand distinct adapter-set series of ~400 bytes
    largest = once + 64 * per_rank_named + lora_sets  # 64 data-parallel ranks behind one API server
    assert largest < DEFAULT_MAX_BODY_BYTES < 2 * largest
    default = build({}, {}, {"engine_url": ["http://127.0.0.1:1"]}).max_body_bytes
    assert default == DEFAULT_MAX_BODY_BYTES, "agent/config/settings.py must default max_body_bytes to it"


# -- through the agent ---------------------------------------------------------------------------------------


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    e = FakeEngine(body=PAGE)
    await e.start()
    yield e
    await e.stop()


async def _sampled(engine: FakeEngine, **flags: object) -> tuple[Agent, str]:
    clock = FakeClock()
    config = build({}, {}, {"engine_url": [engine.url], "process": False, "nvml": False, "interval": "0.5",
                            "windows": "5s,30s", "model": "llama-3-8b", **flags})
    async with started_agent(config, loops=False, clock=clock) as agent:
        for _ in range(3):
            clock.advance(0.5)
            await agent.sample_engines_once()
        return agent, generate_latest(registry_for(lambda: agent.snapshot)).decode()


def _values(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


async def test_a_page_is_refused_when_its_text_would_outgrow_the_cap(engine: FakeEngine) -> None:
    ascii_page = _lines(400)
    cap = len(ascii_page) + 10
    async with aiohttp.ClientSession() as session:
        async def fetch(body: str) -> str:
            engine.body = body
            url = engine.url + "/metrics"
            fetched = await fetch_text(session, url, timeout=5, max_bytes=cap, monotonic=time.monotonic)
            return fetched.text

        assert await fetch(ascii_page) == ascii_page
        assert await fetch("# é\n" + ascii_page[:-10]) == "# é\n" + ascii_page[:-10]  # Latin-1: one byte each
        with pytest.raises(SourceError) as refused:
            await fetch(WIDE + ascii_page[: cap // 2])  # half the cap in bytes, twice it as text
        assert refused.value.reason == "too_large"
        small = WIDE + ascii_page[: cap // 4 - 100]
        assert await fetch(small) == small


async def test_a_huge_model_name_is_cut_counted_and_keeps_metrics_small(engine: FakeEngine) -> None:
    huge = "q" * 5_000
    engine.body = PAGE.replace('model_name="tiny-llama"', f'model_name="{huge}"')
    _, text = await _sampled(engine)
    cut = "q" * expfmt.MAX_LABEL_VALUE_CHARS + expfmt.TRUNCATED_MARK
    models = {dict(k)["model"] for k in _values(text, "rooflight_requests_running")}
    assert models == {cut}
    truncated = list(_values(text, "rooflight_source_label_values_truncated").values())
    lines = sum('model_name="' in line for line in engine.body.splitlines() if line.startswith("vllm:"))
    assert len(truncated) == 1 and 1 <= truncated[0] <= lines
    assert "q" * (expfmt.MAX_LABEL_VALUE_CHARS + 1) not in text
    assert len(text) < 10 * len(huge)  # before: the whole name in every exported series (over 100 of them)


async def test_a_page_over_the_sample_cap_is_read_up_to_it_and_both_drops_are_counted(engine: FakeEngine) -> None:
    models = MIN_PAGE_SAMPLES + 100  # one sample each, on one kept family; max_series 2: cap MIN_PAGE_SAMPLES
    engine.body = "".join(f'{RUNNING}{{engine="0",model_name="m{i}"}} 1\n' for i in range(models))
    _, text = await _sampled(engine, max_series=2)
    assert list(_values(text, "rooflight_source_samples_dropped").values()) == [float(models - MIN_PAGE_SAMPLES)]
    # of the samples read, the models over max_series: still true, and said to be of those read
    assert list(_values(text, "rooflight_source_series_dropped").values()) == [float(MIN_PAGE_SAMPLES - 2)]
    assert len(_values(text, "rooflight_requests_running")) == 2
    assert list(_values(text, "rooflight_source_up").values()) == [1.0]
    engine.body = PAGE
    _, healed = await _sampled(engine, max_series=2)
    assert list(_values(healed, "rooflight_source_samples_dropped").values()) == [0.0]
    assert list(_values(healed, "rooflight_source_label_values_truncated").values()) == [0.0]


# -- memory, in the agent's own process ---------------------------------------------------------------------


def _fill(size: int, line: object) -> str:
    """Lines from `line(i)` until the page holds just under `size` bytes."""
    out, n, i = [], 0, 0
    while True:
        s = line(i) + "\n"  # type: ignore[operator]
        if n + len(s) > size:
            return "".join(out)
        out.append(s)
        n, i = n + len(s), i + 1


WIDE = "# \U0001f600\n"  # one character beyond the BMP: Python holds every character of the page in 4 bytes
HALF_WIDE = "# \u2026\n"  # one beyond Latin-1: 2 bytes a character


def _shapes(size: int) -> list[str]:
    """Pages of just under `size` bytes (as read, or as held) built to cost the most per byte, each a different way."""
    full = [line for line in PAGE.splitlines() if line.startswith("vllm:") and 'model_name="tiny-llama"' in line]
    many = ",".join(f'l{j}="{{i}}"' for j in range(60))
    def per_line(i: int) -> str:
        return f'{RUNNING}{{engine="0",model_name="tiny-llama",pid="{i}"}} 1'

    return [
        # every family of a real page, for as many models as fit
        _fill(size, lambda i: full[i % len(full)].replace("tiny-llama", f"m-{i // len(full)}")),
        # one family, every line a new label set (a `pid` per line)
        _fill(size, per_line),
        # sixty labels per line
        _fill(size, lambda i: f'{RUNNING}{{engine="0",model_name="m{i % 100}",{many.format(i=i)}}} 1'),
        # one label value the size of the page
        f'{RUNNING}{{engine="0",model_name="{"x" * (size - 100)}"}} 1\n',
        # wide text: a half and a quarter of the bytes, as much memory as the cap
        HALF_WIDE + _fill(size // 2 - 200, per_line),
        WIDE + _fill(size // 4 - 200, per_line),
    ]


@dataclass
class _Rotating(FakeEngine):
    """Serves each page in turn, one per request."""

    pages: list[str] = field(default_factory=list)

    async def _metrics(self, request):  # type: ignore[no-untyped-def]
        self.body = self.pages[self.requests % len(self.pages)]
        return await super()._metrics(request)


async def test_rss_stays_under_100_mb_for_any_page_the_agent_accepts() -> None:
    """`rooflight run` against pages at the body cap it runs with, each shape twice, RSS polled throughout."""
    cap = build({}, env_settings(os.environ), {"engine_url": ["http://127.0.0.1:1"]}).max_body_bytes
    pages = _shapes(cap)
    assert all(cap - 4096 < sys.getsizeof(p) - sys.getsizeof("") <= cap for p in pages)
    refused = WIDE + pages[1][: cap - 100]  # four times the cap as text: refused on its bytes
    engine = _Rotating(pages=[*pages, refused])
    await engine.start()
    port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "rooflight", "run", "--engine-url", engine.url, "--listen", f"127.0.0.1:{port}",
         "--no-nvml", "--no-process", "--model", "llama-3-8b", "--interval", "0.5", "--scrape-timeout", "5",
         "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        proc = psutil.Process(agent.pid)
        rss, deadline = [], time.monotonic() + 45
        while engine.requests < 2 * len(engine.pages) + 1:  # every page twice, then one more read
            assert agent.poll() is None, agent.stderr.read().decode() if agent.stderr else ""
            assert time.monotonic() < deadline, f"only {engine.requests} scrapes"
            rss.append(proc.memory_info().rss)
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # the last page parsed
        rss.append(proc.memory_info().rss)
    finally:
        agent.terminate()
        agent.wait(10)
        await engine.stop()
    assert max(rss) < MAX_RSS, f"peak RSS {max(rss) / 1e6:.1f} MB with pages of {cap} bytes"
