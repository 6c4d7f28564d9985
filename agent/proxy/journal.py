"""`rooflight proxy --request-log FILE`: one JSON line per finished request, for what an aggregate cannot say.

A percentile says how many requests missed; the log says which, and lets a load generator's per-request
results be set beside the proxy's, request by request (docs/proxy.md, section Request log). A line holds
times, token counts and outcomes, never a prompt, a completion, a header or a tenant's name.

Off the relay's path: the relay hands a finished request's fields over (a tuple appended to a deque) and a
thread of the journal's own turns them into lines and writes them, once a second and at the end. Bounded:
past MAX_PENDING unwritten requests (a disk that stalls: ~8 MB of them) the oldest are dropped, and a write
that fails drops its batch; either is logged, at most once a minute, with how many were lost, and counted
(rooflight_client_request_log_lost_total). The proxy never waits for the disk. SIGHUP reopens the path.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import signal
import threading
import time
from typing import Any, Iterator

from rooflight.agent.errors import ConfigError
from rooflight.agent.proxy.tracker import RequestRecord

log = logging.getLogger("rooflight.proxy")
MAX_PENDING = 20_000  # entries waiting for the writer (20 s of 1,000 requests/s), ~400 bytes each
WRITE_EVERY_S = 1.0
WARN_EVERY_S = 60.0
CLOSE_WITHIN_S = 5.0  # shutdown waits this long for the last write


@contextlib.contextmanager
def opened(path: str | None) -> Iterator[RequestJournal | None]:
    """--request-log's journal for the proxy's life, None without one; ConfigError (exit 2) when the file cannot
    be opened. At the end it writes what is left and SIGHUP is ignored from then on (ignore_hangup)."""
    journal = None if path is None else RequestJournal(path)
    try:
        yield journal
    finally:
        if journal is not None:
            journal.close()
            ignore_hangup(journal)


def reopen_on_hangup(journal: RequestJournal | None) -> None:
    """SIGHUP reopens the log (logrotate's `create`, or a `postrotate` that signals); without a log SIGHUP keeps
    its default (the process ends). A handler of the interpreter's, not the event loop's: the loop takes its own
    away as it closes, and a SIGHUP in the shutdown after that ended the process (exit -1, every line written).
    Called on the main thread."""
    if journal is not None:
        signal.signal(signal.SIGHUP, lambda signum, frame: journal.reopen())


def ignore_hangup(journal: RequestJournal | None) -> None:
    """With a log, SIGHUP ignored: before the workers start, so that they (and multiprocessing's resource
    tracker) inherit it ignored through their exec and a SIGHUP to the process group (`systemctl kill -s HUP`)
    ends none of them, even before a worker is ready; and once the log is closed, since the interpreter's exit
    puts a Python handler back to the default, and a late SIGHUP ended a clean shutdown with exit -1."""
    if journal is not None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)


FIELDS = ("start", "route", "stream", "status", "outcome", "finish_reason", "upstream_error", "ttft", "last_token",
          "e2e", "tpot", "itl_max", "prompt_tokens", "output_tokens", "counted_by")


def entry(record: RequestRecord) -> tuple[Any, ...]:
    """What a line needs of a record, FIELDS in order (`start` still the monotonic clock's): a tuple of ~400
    bytes, where the record holds its every gap (up to 64 kB)."""
    last = None if record.last_token is None else record.last_token - record.start
    return (record.start, record.route, record.stream, record.status, record.outcome, record.finish_reason,
            record.upstream_error, record.ttft, last, record.e2e, record.tpot, record.itl_max, record.prompt_tokens,
            record.output_tokens, record.counted_by)


def line(values: tuple[Any, ...], unix_offset: float) -> dict[str, Any]:
    """An entry as its log line: times in seconds, `start` on the wall clock (the monotonic start plus
    `unix_offset`, to the microsecond), the rest relative to it and unrounded (JSON writes a float's shortest
    spelling that reads back equal: the very value the exports judged); a time the request did not have is null."""
    out = dict(zip(FIELDS, values))
    out["start"] = round(out["start"] + unix_offset, 6)
    return out


class RequestJournal:
    """Appends each record handed to `add` to `path` as a JSON line; `close` writes what is left."""

    def __init__(self, path: str, every: float = WRITE_EVERY_S, max_pending: int = MAX_PENDING,
                 close_within: float = CLOSE_WITHIN_S) -> None:
        self._fd = _open(path)
        self.path, self._every, self._max, self._close_within = path, every, max_pending, close_within
        self._pending: collections.deque[tuple[Any, ...]] = collections.deque()
        self.written = 0
        self.dropped = 0  # by add() (the relay's thread), past max_pending
        self.failed = 0  # by the writer: lines a failed write did not put in the file whole
        self._torn = False  # a failed write left a part of a line: the next write ends it first
        self._writing = 0  # the lines of the write under way (a blocked one holds them)
        self._reopen = False  # reopen() asked: the writer opens the path anew before its next write
        self._lost_told, self._told_at = 0, float("-inf")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rooflight-proxy-request-log", daemon=True)
        self._thread.start()

    @property
    def lost(self) -> int:
        return self.dropped + self.failed

    def add(self, record: RequestRecord) -> None:
        """Called on the relay's loop at each request's end: the fields a line needs, and an append."""
        if len(self._pending) >= self._max:
            self._pending.popleft()
            self.dropped += 1
            self._tell(f"more than {self._max} waited to be written")  # the writer is stuck: say so from here
        self._pending.append(entry(record))

    def reopen(self) -> None:
        """On SIGHUP: the path is opened anew before the next write (within a second, or once a blocked write
        returns; logrotate's `create` moved the file away), on the writer's thread, which alone writes to the
        descriptor."""
        self._reopen = True

    def close(self) -> None:
        """Write what is left, on the writer's thread, for at most `close_within` seconds: a file that blocks (a
        FIFO nobody reads, a stalled mount) must not hold the proxy's shutdown; what it kept back is logged."""
        self._stop.set()
        self._thread.join(timeout=self._close_within)
        unwritten = len(self._pending) + self._writing
        if self._thread.is_alive():
            log.warning("proxy: --request-log %s: still blocked after %.0f s at shutdown; %d request(s) not"
                        " logged (%d before)", self.path, self._close_within, unwritten + self.lost, self.lost)
            return  # the thread is stuck in a write: the descriptor stays open under it
        with contextlib.suppress(OSError):
            os.close(self._fd)
        if self.lost:
            log.warning("proxy: --request-log %s: %d request(s) not logged in all, %d logged", self.path,
                        self.lost, self.written)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self._write()
        self._write()  # the last: close() waits for it

    def _write(self) -> None:
        if self._reopen:
            self._reopen = False
            self._open_anew()
        batch: list[tuple[Any, ...]] = []
        take = self._pending.popleft
        try:
            while True:
                batch.append(take())
        except IndexError:
            pass
        if not batch:
            return
        offset = time.time() - time.monotonic()  # the records' clock is time.monotonic (agent/proxy/server.py)
        lines = [(json.dumps(line(r, offset), separators=(",", ":")) + "\n").encode() for r in batch]
        prefix = b"\n" if self._torn else b""
        data = memoryview(prefix + b"".join(lines))
        done, self._writing = 0, len(lines)
        try:
            while done < len(data):
                wrote = os.write(self._fd, data[done:])
                if not wrote:
                    raise OSError("the file took no bytes")
                done += wrote
        except OSError as exc:  # a full disk, a file size limit
            whole = 0
            if done:  # some of it reached the file: the lines in it whole are written, a part of one is not
                body = done - len(prefix)
                whole = _whole_lines(lines, body)
                self._torn = body != sum(map(len, lines[:whole]))
            self.written += whole
            self.failed += len(lines) - whole
            self._writing = 0
            self._tell(f"{type(exc).__name__}: {exc}")
            return
        self._torn, self._writing = False, 0
        self.written += len(lines)

    def _open_anew(self) -> None:
        """The path opened again; where it cannot be, the file open before is kept (until the next SIGHUP), and
        that is logged. A line a failed write cut short is ended in the file it is in: the path may be that
        same file (a SIGHUP with no rotation), where the next line would otherwise be glued to it."""
        try:
            fd = _open_fd(self.path)
        except OSError as exc:
            log.warning("proxy: --request-log %s: not reopened on SIGHUP (%s); still writing the file opened before",
                        self.path, exc.strerror or exc)
            return
        old, self._fd = self._fd, fd
        if self._torn:
            try:
                os.write(old, b"\n")
                self._torn = False
            except OSError:  # still cut short: in the file now open, if it is that one, the next write ends it
                self._torn = os.path.sameopenfile(old, fd)
        os.close(old)
        log.info("proxy: --request-log %s: reopened", self.path)

    def _tell(self, why: str) -> None:
        """Log the count lost so far, at most once every WARN_EVERY_S."""
        now = time.monotonic()
        if self.lost > self._lost_told and now - self._told_at >= WARN_EVERY_S:
            self._told_at, self._lost_told = now, self.lost
            log.warning("proxy: --request-log %s: %d request(s) not logged so far (the latest: %s)", self.path,
                        self.lost, why)


def _whole_lines(lines: list[bytes], done: int) -> int:
    """How many of `lines`, written one after another, lie whole in the first `done` bytes."""
    whole = 0
    for one in lines:
        done -= len(one)
        if done < 0:
            break
        whole += 1
    return whole


def _open(path: str) -> int:
    """The file, opened to append (O_APPEND: logrotate's copytruncate moves the end under us safely), or
    ConfigError. O_NONBLOCK for the open only: a FIFO nobody reads fails at once (ENXIO) where it blocked the
    start; the writes then block as a file's do (on the journal's thread)."""
    try:
        return _open_fd(path)
    except OSError as exc:
        raise ConfigError(f"--request-log {path}: cannot write there ({exc.strerror or exc}); choose a file in a"
                          " directory this user may write") from None


def _open_fd(path: str) -> int:
    """_open's descriptor, or OSError (a reopen keeps the file it had)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    os.set_blocking(fd, True)
    return fd
