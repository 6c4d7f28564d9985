"""How a source says one sample failed, and why (the `reason` label of rooflight_source_errors_total).

`counter_regress` is the one reason that is not a failed sample: the page was read, but a counter on it
keeps going backwards (rooflight.agent.signals.windows.COUNTER_REGRESS_LIMIT), so its rates are withheld.
"""

from __future__ import annotations

REASONS = ("timeout", "refused", "http_status", "parse", "too_large", "counter_regress", "nvml", "process", "other")

# The reasons each source can fail with; their error counters start at zero so rates work from the start.
SOURCE_REASONS = {
    "engine": ("timeout", "refused", "http_status", "parse", "too_large", "counter_regress", "other"),
    "nvml": ("nvml", "timeout", "other"),
    "process": ("process", "other"),
}


class SourceError(Exception):
    """One failed sample. `reason` is one of REASONS; the message is for logs."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown reason {reason!r}")
        super().__init__(message)
        self.reason = reason


class ParseError(SourceError):
    def __init__(self, message: str) -> None:
        super().__init__("parse", message)
