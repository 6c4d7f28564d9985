"""The health of one source: up, last success, last duration, error counts by reason.

Mutable, owned by the loop that samples the source; `view()` gives the frozen Health a Snapshot holds.
"""

from __future__ import annotations

import logging

from rooflight.agent.metrics.snapshot import Health
from rooflight.agent.signals.derive import MBU_OUT_OF_RANGE, MFU_OUT_OF_RANGE
from rooflight.collectors.errors import REASONS, SOURCE_REASONS
from rooflight.collectors.normalize import KV_USAGE_OUT_OF_RANGE
# Why a value was withheld as physically impossible (the reason label of rooflight_source_values_dropped_total);
# the engine loop adds its own for unusable engine input (engine_loop.INPUT_REASONS).
VALUE_REASONS = (MBU_OUT_OF_RANGE, MFU_OUT_OF_RANGE, KV_USAGE_OUT_OF_RANGE)

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
        # Starting is earned by evidence of a model load, never by the agent's own start: an engine's port that
        # has refused every connection since the agent started (nothing listens yet: a new engine process
        # loading its weights binds its port once loaded, on every rollout and scale-up). A 503, a page that is
        # not an engine's, a timeout (something listens and fails), or an engine that has answered once, is
        # down. No other source loads anything: one that keeps failing is down (rules/outage.py reads it).
        self.starting = False
        self._only_refused = source == "engine"  # every sample so far refused (none answered, none failed else)
        self.absent = False  # the hardware it reads is not on this machine (no NVML library): not exported
        self._noted: str | None = None  # the last message of note(): the same one again is not logged again
        engine = source == "engine"
        self.series_dropped: int | None = 0 if engine else None
        self.samples_dropped: int | None = 0 if engine else None
        self.labels_truncated: int | None = 0 if engine else None
        self.canary: dict[str, int] | None = None  # engine sources with --canary: its requests by result
        # Counted from zero so that rates work from the start, as the error counts.
        self.values_dropped: dict[str, int] = dict.fromkeys(VALUE_REASONS, 0) if engine else {}

    def ok(self, wall: float, duration: float, monotonic: float | None = None) -> None:
        self.up, self.last_success, self.duration, self.message = True, wall, duration, None
        self.sampled, self.starting, self._only_refused = True, False, False
        self.last_success_monotonic = monotonic

    def fail(self, reason: str, message: str, duration: float) -> None:
        if not self.up and self.message == message:
            pass  # the same failure again: counted, not logged again
        else:
            log.warning("%s source for %s failed (%s): %s", self.source, self.target, reason, message)
        self.up, self.duration, self.message, self.sampled = False, duration, message, True
        self.errors[reason] = self.errors.get(reason, 0) + 1
        self._only_refused = self._only_refused and reason == "refused"
        self.starting = self._only_refused

    def note(self, reason: str, message: str) -> None:
        """An error reason of a sample that was still read (counter_regress): counted, logged when it
        changes, `up` left as it is."""
        if message != self._noted:
            self._noted = message
            log.warning("%s source for %s: %s", self.source, self.target, message)
        self.errors[reason] = self.errors.get(reason, 0) + 1

    def drop_value(self, reason: str) -> None:
        """A value withheld as physically impossible (one of VALUE_REASONS)."""
        self.values_dropped[reason] = self.values_dropped.get(reason, 0) + 1

    def view(self) -> Health:
        return Health(
            self.source, self.target, self.up, self.last_success, self.duration, dict(self.errors), self.message,
            self.series_dropped, self.samples_dropped, self.labels_truncated, dict(self.values_dropped),
            self.starting, None if self.canary is None else dict(self.canary),
        )
