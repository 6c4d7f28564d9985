"""The health of one source: up, last success, last duration, error counts by reason.

Mutable, owned by the loop that samples the source; `view()` gives the frozen Health a Snapshot holds.
"""

from __future__ import annotations

import logging

from rooflight.agent.metrics.snapshot import Health
from rooflight.collectors.errors import REASONS, SOURCE_REASONS

log = logging.getLogger("rooflight")


class SourceState:
    """Up, last success, last duration and error counts of one source; mutable, owned by its loop."""

    def __init__(self, source: str, target: str) -> None:
        self.source, self.target = source, target
        self.up = False
        self.last_success: float | None = None
        self.last_success_monotonic: float | None = None
        self.duration: float | None = None
        self.errors = dict.fromkeys(SOURCE_REASONS.get(source, REASONS), 0)
        self.message: str | None = None
        self.sampled = False  # whether a sample was attempted at all
        self.series_dropped: int | None = 0 if source == "engine" else None

    def ok(self, wall: float, duration: float, monotonic: float | None = None) -> None:
        self.up, self.last_success, self.duration, self.message = True, wall, duration, None
        self.sampled = True
        self.last_success_monotonic = monotonic

    def fail(self, reason: str, message: str, duration: float) -> None:
        if not self.up and self.message == message:
            pass  # the same failure again: counted, not logged again
        else:
            log.warning("%s source for %s failed (%s): %s", self.source, self.target, reason, message)
        self.up, self.duration, self.message, self.sampled = False, duration, message, True
        self.errors[reason] = self.errors.get(reason, 0) + 1

    def view(self) -> Health:
        return Health(
            self.source, self.target, self.up, self.last_success, self.duration, dict(self.errors), self.message,
            self.series_dropped,
        )
