"""`rooflight proxy --request-log FILE`: a line per finished request, with the times the exports judged it by.

The command as a user runs it (one process, and --workers 2), over real HTTP to a scripted upstream whose
first token and gaps are known; the journal alone for what a disk does wrong (a full one, a stalled one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import AsyncIterator, Callable

import aiohttp
import psutil
import pytest

from fake_upstream import FakeUpstream, Script

from rooflight.agent.proxy.journal import RequestJournal
from rooflight.agent.proxy.tracker import COMPLETE, RequestRecord
from demo_procs import async_child, wait_healthy
from support import free_port

TTFT, GAP, TOKENS = 0.05, 0.02, 5
PROMPT = "a secret the log must never hold"
LOST = "rooflight_client_request_log_lost_total"


def _hang_up(pid: int) -> list[psutil.Process]:
    """SIGHUP to a process and every process under it (a process group's hangup): those still running after."""
    tree = [psutil.Process(pid)]
    with contextlib.suppress(psutil.Error):
        tree += tree[0].children(recursive=True)
    for one in tree:
        with contextlib.suppress(psutil.Error):
            one.send_signal(signal.SIGHUP)
    return [one for one in tree if one.is_running() and one.status() != psutil.STATUS_ZOMBIE]


async def _hang_up_until(proc: asyncio.subprocess.Process, every: float = 0.02, once_it_has_children: bool = False
                         ) -> None:
    """SIGHUP to the whole tree every `every` s while the process runs (cancelled by the caller); with
    `once_it_has_children`, from when its first child process appears (a process still importing has no handler
    of its own yet: SIGHUP ends it, as it ends any program then)."""
    while proc.returncode is None:
        with contextlib.suppress(psutil.Error):
            if not once_it_has_children or psutil.Process(proc.pid).children():
                _hang_up(proc.pid)
        await asyncio.sleep(every)


@contextlib.asynccontextmanager
async def _proxy(log: Path, workers: int, hang_up_while_starting: bool = False
                 ) -> AsyncIterator[tuple[asyncio.subprocess.Process, aiohttp.ClientSession, str, str]]:
    """The command in front of a fake upstream, writing `log`: (its process, a session, its URL, its /metrics);
    `hang_up_while_starting`: SIGHUP to every process of it from its first worker's start until it answers."""
    up = FakeUpstream(scripts={"m": Script(ttft=TTFT, gaps=(GAP,) * (TOKENS - 1))})
    await up.start()
    port, metrics_port = free_port(), free_port()
    try:
        async with async_child(
                sys.executable, "-m", "rooflight.agent.proxy.cli", "--upstream", up.url, "--listen", f"127.0.0.1:{port}",
                "--metrics-listen", f"127.0.0.1:{metrics_port}", "--workers", str(workers), "--request-log", str(log),
                "--slo", f"tpot={GAP * 2:g}", "--log-level", "warning",
        ) as proc:
            async with aiohttp.ClientSession() as session:
                metrics = f"http://127.0.0.1:{metrics_port}"
                hangups = asyncio.ensure_future(_hang_up_until(proc, once_it_has_children=True)) \
                    if hang_up_while_starting else None
                try:
                    await wait_healthy(session, metrics + "/-/healthy")
                finally:
                    if hangups is not None:
                        hangups.cancel()
                yield proc, session, f"http://127.0.0.1:{port}", metrics + "/metrics"
    finally:
        await up.stop()


async def _stream(session: aiohttp.ClientSession, url: str, requests: int) -> None:
    """`requests` streamed chat completions, one after another, each read to its end."""
    body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": PROMPT}]})
    for _ in range(requests):
        async with session.post(url + "/v1/chat/completions", data=body) as r:
            assert r.status == 200 and (await r.read()).endswith(b"data: [DONE]\n\n")


async def _metrics_when(session: aiohttp.ClientSession, url: str, holds: Callable[[str], bool]) -> str:
    """/metrics once `holds` it (a refresh, a worker's flush, the log's writer: seconds on a busy machine), or as
    it stands after 20 s."""
    metrics = ""
    for _ in range(200):
        async with session.get(url) as r:
            metrics = await r.text()
        if holds(metrics):
            break
        await asyncio.sleep(0.1)
    return metrics


async def _stopped(proc: asyncio.subprocess.Process) -> None:
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 20) == 0  # the log is written whole at the end


async def _served(tmp_path: Path, workers: int, requests: int) -> tuple[list[dict], float, float, str]:
    """`requests` streamed through the command, stopped by SIGTERM: its log's lines, the wall clock before
    and after the requests, and /metrics as it stood."""
    log = tmp_path / "requests.jsonl"
    async with _proxy(log, workers) as (proc, session, url, metrics_url):
        before = time.time()
        await _stream(session, url, requests)
        after = time.time()
        metrics = await _metrics_when(session, metrics_url, lambda page: _judged(page) >= requests)
        await _stopped(proc)
    text = log.read_text()
    assert PROMPT not in text and "content" not in text
    return [json.loads(line) for line in text.splitlines()], before, after, metrics


def _total(metrics: str, name: str) -> float:
    """The sum of a counter's series on a /metrics page."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(name + "{"))


def _judged(metrics: str) -> float:
    return _total(metrics, "rooflight_client_slo_requests_total")


@pytest.mark.parametrize("workers", [1, 2])
async def test_each_request_is_a_line_with_the_times_it_was_judged_by(tmp_path: Path, workers: int) -> None:
    lines, before, after, metrics = await _served(tmp_path, workers, requests=6)
    assert len(lines) == 6  # one a request: none lost at SIGTERM, none twice (workers: sent to the parent)
    for line in lines:
        assert (line["route"], line["status"], line["outcome"], line["stream"]) == ("chat", 200, COMPLETE, True)
        assert line["output_tokens"] == TOKENS and line["prompt_tokens"] == 7
        assert before - 1.0 <= line["start"] <= after + 1.0  # the wall clock (a clock read apart: 1 s)
        # the upstream's own waits bound the times from below, as sums (a late read of one token shortens the
        # next gap); 20x above (a unit's error is 1000x)
        assert TTFT <= line["ttft"] <= 20 * TTFT
        assert TTFT + (TOKENS - 1) * GAP <= line["last_token"] <= line["e2e"]
        assert 0 < line["tpot"] <= line["itl_max"] <= 20 * GAP  # the mean gap, then the longest
        assert line["tpot"] == pytest.approx((line["last_token"] - line["ttft"]) / (TOKENS - 1), abs=2e-6)
    starts = [line["start"] for line in lines]
    assert starts == sorted(starts)  # one after another, each ended before the next began: in order
    # the exports' goodput is the log's: the same records, the same rule
    assert _judged(metrics) == 6 and _total(metrics, "rooflight_client_slo_good_requests_total") == sum(line["tpot"] <= GAP * 2 for line in lines)
    assert "rooflight_client_request_log_lost_total{" in metrics and _total(metrics, LOST) == 0


@pytest.mark.parametrize("workers", [1, 2])
async def test_lines_a_full_disk_lost_are_counted_on_metrics(workers: int) -> None:
    async with _proxy(Path("/dev/full"), workers) as (proc, session, url, metrics_url):
        await _stream(session, url, 3)
        metrics = await _metrics_when(session, metrics_url, lambda page: _total(page, LOST) >= 3)
        assert _total(metrics, LOST) == 3
        assert _total(metrics, "rooflight_client_requests_total") == 3  # the requests themselves went through
        await _stopped(proc)


@pytest.mark.parametrize("workers", [1, 2])
async def test_sighup_reopens_the_log_a_rotation_moved_away(tmp_path: Path, workers: int) -> None:
    """logrotate's `create` with a postrotate that signals: the moved file holds the lines before, the new one
    those after. SIGHUPs to every process (a process group's hangup: `systemctl kill -s HUP`) from its workers'
    start, after its rotation and through its shutdown end none of them: the workers (and multiprocessing's resource
    tracker) started with it ignored, and the parent's handler outlives its event loop (exit 0, not -1)."""
    log, moved = tmp_path / "requests.jsonl", tmp_path / "requests.jsonl.1"
    async with _proxy(log, workers, hang_up_while_starting=True) as (proc, session, url, metrics_url):
        await _stream(session, url, 2)
        for _ in range(200):  # written within a second (a busy machine: more)
            if log.exists() and log.read_text().count("\n") == 2:
                break
            await asyncio.sleep(0.1)
        tree = len(_hang_up(proc.pid))
        log.rename(moved)
        assert len(_hang_up(proc.pid)) == tree == 1 + (workers + 1 if workers > 1 else 0)  # workers, the tracker
        for _ in range(200):
            if log.exists():
                break
            await asyncio.sleep(0.1)
        assert log.exists(), "SIGHUP did not reopen the log's path"
        await _stream(session, url, 3)
        hangups = asyncio.ensure_future(_hang_up_until(proc, every=0.002))
        try:
            await _stopped(proc)
        finally:
            hangups.cancel()
    assert [len(path.read_text().splitlines()) for path in (moved, log)] == [2, 3]
    assert all(json.loads(line)["outcome"] == COMPLETE for line in log.read_text().splitlines())


def test_a_log_the_proxy_cannot_open_exits_2_saying_what_to_fix(tmp_path: Path) -> None:
    """A FIFO nobody reads passes the flag's check (its directory exists) and fails the open, at start: not a
    start that waits on it forever (opening a FIFO to write blocks until a reader comes)."""
    fifo = tmp_path / "requests.fifo"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "rooflight.agent.proxy.cli", "--upstream", "http://127.0.0.1:9",
                           "--listen", f"127.0.0.1:{free_port()}", "--metrics-listen", f"127.0.0.1:{free_port()}",
                           "--request-log", str(fifo)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"--request-log {fifo}: cannot write there (No such device or address)" in done.stderr
    assert "Traceback" not in done.stderr


def _record(i: int) -> RequestRecord:
    return RequestRecord(route="completions", tenant=None, start=float(i), end=i + 1.0, status=200, outcome=COMPLETE,
                         stream=True, finish_reason="length", ttft=0.25, prompt_tokens=3, output_tokens=4,
                         counted_by="usage", last_token=i + 0.85)


def test_a_writer_that_falls_behind_drops_the_oldest_and_says_how_many(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "requests.jsonl"
    journal = RequestJournal(str(path), every=3600.0, max_pending=3)  # the writer never wakes before close()
    for i in range(5):
        journal.add(_record(i))
    with caplog.at_level(logging.WARNING, logger="rooflight.proxy"):
        journal.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["tpot"] for line in lines] == [pytest.approx(0.2)] * 3  # (0.85 - 0.25) / (4 - 1)
    assert (journal.written, journal.dropped, journal.failed) == (3, 2, 0)
    starts = [line["start"] - (time.time() - time.monotonic()) for line in lines]
    assert starts == [pytest.approx(s, abs=0.5) for s in (2.0, 3.0, 4.0)]  # the newest kept
    assert "2 request(s) not logged" in caplog.text


def test_a_full_disk_costs_the_lines_not_the_proxy(caplog: pytest.LogCaptureFixture) -> None:
    journal = RequestJournal("/dev/full", every=0.05)  # every write fails with ENOSPC
    with caplog.at_level(logging.WARNING, logger="rooflight.proxy"):
        for i in range(4):
            journal.add(_record(i))
        for _ in range(200):  # the writer's next turn (a busy machine: seconds)
            if journal.failed:
                break
            time.sleep(0.05)
        journal.add(_record(9))
        journal.close()
    assert journal.written == 0 and journal.failed == 5
    assert "request(s) not logged so far" in caplog.text and "No space left on device" in caplog.text


def test_a_reopen_that_cannot_open_the_path_keeps_writing_the_file_it_had(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A rotation that moved the log's directory away: the path cannot be opened anew, no line is lost."""
    directory = tmp_path / "logs"
    directory.mkdir()
    journal = RequestJournal(str(directory / "requests.jsonl"), every=0.05)
    journal.add(_record(0))
    directory.rename(tmp_path / "moved")
    with caplog.at_level(logging.WARNING, logger="rooflight.proxy"):
        journal.reopen()
        journal.add(_record(1))
        journal.close()
    assert len((tmp_path / "moved" / "requests.jsonl").read_text().splitlines()) == 2
    assert (journal.written, journal.lost) == (2, 0)
    assert "not reopened on SIGHUP (No such file or directory); still writing the file opened before" in caplog.text


def test_a_request_waiting_to_be_logged_holds_its_fields_not_its_gaps(tmp_path: Path) -> None:
    """A stalled disk holds MAX_PENDING waiting: each must be small, whatever its stream's length (a record
    holds its every gap, up to 64 kB; 20,000 of those would be 1.3 GB)."""
    import tracemalloc

    from rooflight.agent.proxy.tracker import EXACT_GAPS, TokenGaps

    journal = RequestJournal(str(tmp_path / "requests.jsonl"), every=3600.0)
    gaps = TokenGaps(tuple(0.01 for _ in range(EXACT_GAPS)))
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for i in range(200):
            record = RequestRecord(route="completions", tenant=None, start=float(i), end=i + 90.0, status=200,
                                   outcome=COMPLETE, stream=True, finish_reason="length", ttft=0.25,
                                   itl=TokenGaps(gaps), prompt_tokens=3, output_tokens=EXACT_GAPS + 1,
                                   counted_by="usage", last_token=i + 82.0)
            journal.add(record)
            del record
        held = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    journal.close()
    assert held / 200 < 1024, f"{held / 200:.0f} bytes a waiting request"
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 200 and json.loads(lines[0])["itl_max"] == 0.01


@pytest.mark.parametrize(("given", "says"), [
    ("{tmp}/no-such-dir/requests.jsonl", "there is no directory {tmp}/no-such-dir; create it or choose another"),
    ("{tmp}", "{tmp}: is a directory; name a file in it, e.g. --request-log {tmp}/requests.jsonl"),
    ("  ", "--request-log: '  ' is not a file path; write e.g. --request-log /var/log/rooflight/requests.jsonl"),
])
def test_check_only_refuses_a_log_path_that_cannot_be_a_file(tmp_path: Path, given: str, says: str) -> None:
    done = subprocess.run([sys.executable, "-m", "rooflight.agent.proxy.cli", "--upstream", "http://127.0.0.1:9",
                           "--request-log", given.format(tmp=tmp_path), "--check-only"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says.format(tmp=tmp_path) in done.stderr, done.stderr


def test_a_log_that_blocks_holds_shutdown_no_longer_than_its_limit(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A FIFO whose reader never reads (a stalled collector, a hung mount): the writer blocks once the pipe
    is full; close() gives up after close_within and says how many were not logged."""
    fifo = tmp_path / "requests.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        journal = RequestJournal(str(fifo), every=0.05, close_within=0.5)
        for i in range(2000):  # ~600 kB of lines: ten times a pipe's buffer
            journal.add(_record(i))
        for _ in range(200):  # the writer's first turn, now blocked in its write
            if not journal._pending:
                break
            time.sleep(0.05)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="rooflight.proxy"):
            journal.close()
        assert time.monotonic() - started < 5.0  # 0.5 s asked; 10x for a busy machine
        # every request not in the file is counted: those waiting and those of the write it is stuck in
        assert f"still blocked after 0 s at shutdown; {2000 - journal.written} request(s) not logged (0 before)" \
            in caplog.text
    finally:
        os.close(reader)  # the writer's write fails (EPIPE) and its thread ends


@pytest.mark.parametrize("reopen", [None, "the same file", "a moved file"])
def test_a_write_cut_short_leaves_whole_lines_and_counts_what_it_cut(tmp_path: Path, reopen: str | None) -> None:
    """A file size limit reached mid-batch (as a full disk would): the lines written whole are counted as
    written, the cut one and the rest as failed, and the cut line is ended before the next line: by the next
    write, or at a SIGHUP's reopen in the file it is in (the same file reopened glued the next line to it)."""
    path, moved = tmp_path / "requests.jsonl", tmp_path / "requests.jsonl.1"
    script = f"""
import os, resource, json
from rooflight.agent.proxy.journal import RequestJournal
from rooflight.agent.proxy.tracker import COMPLETE, RequestRecord
def record(i):
    return RequestRecord(route="completions", tenant=None, start=float(i), end=i + 1.0, status=200, outcome=COMPLETE,
                         stream=True, finish_reason="length", ttft=0.25, prompt_tokens=3, output_tokens=4,
                         counted_by="usage", last_token=i + 0.85)
journal = RequestJournal({str(path)!r}, every=3600.0)
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))  # SIGXFSZ: ignored by Python
for i in range(10):
    journal.add(record(i))
journal._write()
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
if {reopen!r} == "a moved file":
    os.rename({str(path)!r}, {str(moved)!r})
if {reopen!r}:
    journal.reopen()
for i in range(10, 12):
    journal.add(record(i))
journal.close()
print(json.dumps([journal.written, journal.failed]))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    written, failed = json.loads(done.stdout)
    assert written + failed == 12 and 0 < failed < 10
    files = [moved, path] if reopen == "a moved file" else [path]
    parsed, torn = [], []
    for text in (line for file in files for line in file.read_text().splitlines()):
        try:
            parsed.append(json.loads(text))
        except json.JSONDecodeError:
            torn.append(text)
    assert len(parsed) == written and len(torn) == 1  # the cut line alone, ended by the next write
    assert all(file.read_bytes().endswith(b"\n") for file in files)
    assert len(path.read_text().splitlines()) == (2 if reopen == "a moved file" else written + 1)
    assert files[0].stat().st_size > 1000  # the size limit was reached (the test cut what it meant to)
