"""`rooflight proxy --request-log FILE`: one JSON line per finished request, for what an aggregate cannot say.

A percentile says how many requests missed; the log says which, and lets a load generator's per-request
results be set beside the proxy's, request by request (docs/proxy.md, section Request log). A line holds
times, token counts and outcomes, never a prompt, a completion, a header or a tenant's name.

Off the relay's path: the relay hands a finished request's fields over (a tuple appended to a deque) and a
thread of the journal's own turns them into lines and writes them, once a second and at the end. Bounded:
past MAX_PENDING unwritten requests (a disk that stalls: ~8 MB of them) the oldest are dropped, and a write
that fails drops its batch; either is logged, at most once a minute, with how many were lost. The proxy
never waits for the disk.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import threading
import time
from typing import IO, Any

from rooflight.agent.errors import ConfigError
from rooflight.agent.proxy.tracker import RequestRecord

log = logging.getLogger("rooflight.proxy")
MAX_PENDING = 20_000  # entries waiting for the writer (20 s of 1,000 requests/s), ~400 bytes each
WRITE_EVERY_S = 1.0
WARN_EVERY_S = 60.0


def open_for(path: str | None) -> RequestJournal | None:
    """--request-log's journal, None without one; ConfigError (exit 2) when the file cannot be opened."""
    return None if path is None else RequestJournal(path)


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

    def __init__(self, path: str, every: float = WRITE_EVERY_S, max_pending: int = MAX_PENDING) -> None:
        try:
            # unbuffered: a failed write leaves nothing behind to be written twice by the next one
            self._file: IO[bytes] = open(path, "ab", buffering=0)  # noqa: SIM115 (closed by close())
        except OSError as exc:
            raise ConfigError(f"--request-log {path}: cannot write there ({exc.strerror or exc}); choose a file"
                              " in a directory this user may write") from None
        self.path, self._every, self._max = path, every, max_pending
        self._pending: collections.deque[tuple[Any, ...]] = collections.deque()
        self.written = 0
        self.dropped = 0  # by add() (the relay's thread), past max_pending
        self.failed = 0  # by the writer, a batch whose write failed
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
        self._pending.append(entry(record))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)
        self._write()
        with contextlib.suppress(OSError):
            self._file.close()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self._write()

    def _write(self) -> None:
        batch: list[tuple[Any, ...]] = []
        take = self._pending.popleft
        try:
            while True:
                batch.append(take())
        except IndexError:
            pass
        why = f"more than {self._max} waited to be written"
        if batch:
            offset = time.time() - time.monotonic()  # the records' clock is time.monotonic (agent/proxy/server.py)
            data = memoryview("".join(json.dumps(line(r, offset), separators=(",", ":")) + "\n"
                                      for r in batch).encode())
            try:
                while data:
                    wrote = self._file.write(data)
                    if not wrote:
                        raise OSError("the file took no bytes")
                    data = data[wrote:]
                self.written += len(batch)
            except (OSError, ValueError) as exc:  # a full disk, a file closed under us
                self.failed += len(batch)
                why = f"{type(exc).__name__}: {exc}"
        if self.lost > self._lost_told and time.monotonic() - self._told_at >= WARN_EVERY_S:
            log.warning("proxy: --request-log %s: %d request(s) not logged so far (the latest: %s)", self.path,
                        self.lost, why)
            self._told_at, self._lost_told = time.monotonic(), self.lost
