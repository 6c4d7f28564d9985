"""Time, injected: windows and detectors are tested with a fake clock, never with sleeps."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def time(self) -> float: ...


class SystemClock:
    """Monotonic time for rates (immune to NTP steps), wall time for exported timestamps."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


@dataclass
class FakeClock:
    """A clock that moves only when told to."""

    now: float = 1_000.0
    wall_offset: float = 1_700_000_000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now + self.wall_offset

    def advance(self, seconds: float) -> None:
        self.now += seconds
