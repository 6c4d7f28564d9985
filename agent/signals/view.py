"""What the derive step (signals/series.py) makes of one (model, rank) of one target on one sample:
plain frozen data, built once per sample on the sampling path. The snapshot holds it; the exposition, the
JSON endpoint and the status page only read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from rooflight.agent.signals.derive import WindowValues, WorkTotals
from rooflight.agent.signals.detectors import Verdicts
from rooflight.agent.signals.headroom import WindowSignals
from rooflight.collectors.samples import EngineSeries


@dataclass(frozen=True, slots=True)
class SeriesView:
    """One (model, rank) of one target: the engine's latest values and what the agent derived."""

    series: EngineSeries
    windows: tuple[WindowValues, ...] = ()
    verdicts: Verdicts | None = None  # None where the detectors could not run (no window yet)
    batch_max: float | None = None
    live_kv_bytes: float | None = None
    signals: tuple[WindowSignals, ...] = ()  # one per window: headroom, saturation, capacity, cost, tokens/J
    # The engine's memory and scheduler settings (its page's for this rank, over its info endpoint's),
    # as label name -> value: rooflight_engine_config_info.
    settings: Mapping[str, str] = field(default_factory=dict)
    work: WorkTotals | None = None  # bytes and FLOPs as MBU and MFU count them, since the agent began (counters)
