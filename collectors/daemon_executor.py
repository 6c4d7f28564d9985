"""An Executor with one daemon worker thread, for blocking C calls that may hang (NVML).

concurrent.futures' own ThreadPoolExecutor joins its threads at interpreter exit, so one NVML call
stuck in a wedged driver would keep the agent from ever exiting; a daemon thread does not.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Executor, Future
from typing import Any, Callable


class DaemonThreadExecutor(Executor):
    """One daemon worker thread: a hung NVML call cannot block interpreter exit."""

    def __init__(self, name: str = "rooflight-nvml") -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fut, fn = job
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # handed to the caller through the future
                    fut.set_exception(exc)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self._jobs.put((fut, lambda: fn(*args, **kwargs)))
        return fut

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._jobs.put(None)
        if wait:
            self._thread.join()
