"""What the status page shows, as plain data: `/api/v1/status`, built from one Snapshot on request.

`/api/v1/snapshot` is what `/metrics` shows; this adds what the page draws: each target's roofline
(peaks, ridge point), the live operating points of decode and prefill on it, the ceilings `rooflight plan`
gives for the current batch, the detectors with one sentence each and their runbook link, each source's
last error reason, and the sparklines the agent keeps of the last five minutes (recorded as it samples,
agent/metrics/history.py). Nothing else here runs on the sampling path: every figure is computed when a
client asks, from the frozen Snapshot the agent already published. Like
/api/v1/snapshot it shows no URL and no error message (docs/security.md): everything it shows is a
number /metrics exports or arithmetic on them and on the agent's constants.

Operating points (shortest window, the livest one), both the step model's (agent/roofline/step.py):
- decode: intensity = the agent's decode arithmetic intensity (a decode step of the mean running batch: its
  FLOPs over the weights it touches and the live KV bytes), attained FLOP/s = MFU(decode) x peak FLOP/s.
- prefill: intensity = the prefill FLOP/s MFU counts over the bytes/s the engine's steps read (MBU's
  numerator: the prompt tokens' FLOPs over every step's bytes, averaged over all steps, so a lower bound on
  one prefill step's intensity), attained FLOP/s = MFU(prefill) x peak FLOP/s.
The ceilings are the step model's too: a decode step of the same batch over the same live KV per sequence (and
of the batch cap over it), at the roofline of the copy's peaks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from rooflight.agent import __version__
from rooflight.agent.metrics.history import HISTORY_FIELDS, SeriesKey, Sparklines
from rooflight.agent.metrics.snapshot import Health, SeriesView, Snapshot, TargetView
from rooflight.agent.roofline import physics
from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.roofline.step import Decode, Step
from rooflight.agent.metrics import family
from rooflight.agent.metrics.exposition import api_values, page_names
from rooflight.agent.signals.derive import WindowValues
from rooflight.agent.signals.detectors import detectors as registered, runbook_anchor

# The rules' default runbook_url base (rules/config.py; tests hold the two equal). The agent sits below
# the rules package, so it keeps its own copy rather than importing upwards.
RUNBOOK_BASE_URL = "https://github.com/rooflight/rooflight/blob/main/docs/runbooks.md"



def runbook_url(alert: str, base: str = RUNBOOK_BASE_URL) -> str:
    """The runbook section of an alert: GitHub's anchor of its heading."""
    return f"{base}#{runbook_anchor(alert)}"


def _num(value: float | None) -> float | None:
    """A number JSON can carry and /metrics would show: finite and not negative, else None."""
    if value is None or isinstance(value, bool):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


def _nums(values: Mapping[str, float]) -> dict[str, float]:
    return {k: v for k, v in ((k, _num(v)) for k, v in values.items()) if v is not None}


# -- history ---------------------------------------------------------------------------------------

@dataclass
class History:
    """What the page shows of the recent past: the agent's sparklines (recorded as its engines are sampled,
    agent/metrics/history.py) and each source's last error reason, followed while someone looks."""

    sparklines: Sparklines = field(default_factory=Sparklines)
    _errors: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    _last_error: dict[tuple[str, str], tuple[float | None, str]] = field(default_factory=dict)

    def record(self, snap: Snapshot) -> None:
        """Which error reason grew last, per source: the reason label /metrics counts, never the message
        (pages show nothing /metrics does not, docs/security.md). On a first look only a single failing
        reason names the last error; its time is then unknown."""
        seen = set()
        for h in snap.health:
            key = (h.source, h.target)
            seen.add(key)
            now, before = dict(h.errors), self._errors.get(key)
            if before is None:
                failing = [r for r, n in now.items() if n]
                if len(failing) == 1:
                    self._last_error[key] = (None, failing[0])
            else:
                grown = {r: n - before.get(r, 0) for r, n in now.items() if n > before.get(r, 0)}
                if grown:
                    self._last_error[key] = (snap.created, max(grown, key=lambda r: (grown[r], r)))
            self._errors[key] = now
        for key in set(self._errors) - seen:
            self._errors.pop(key, None)
            self._last_error.pop(key, None)

    def series(self, key: SeriesKey) -> dict[str, list[float | None]]:
        """The series' sparkline columns: "t" and one list per HISTORY_FIELDS name."""
        return self.sparklines.series(key)

    def last_error(self, source: str, target: str) -> tuple[float | None, str] | None:
        """(when, reason) of the source's latest error seen while someone looked."""
        return self._last_error.get((source, target))


def _engine_time(snap: Snapshot, target: str) -> float | None:
    """When the target's engine was last sampled: a new value means new engine numbers."""
    for h in snap.health:
        if h.source == "engine" and h.target == target:
            return h.last_success
    return snap.created or None


# -- the roofline ----------------------------------------------------------------------------------

def roofline_dict(c: TargetConstants | None) -> dict[str, Any] | None:
    """The target's roofs: peaks of all the GPUs one model copy spans, and where they meet (none for a GPU
    no profile covers: no roofs are drawn rather than another GPU's)."""
    if c is None or c.gpu is None:
        return None
    return {
        "gpu_profile": c.gpu.key,
        "gpu_name": c.gpu.name,
        "tensor_parallel_size": c.tensor_parallel_size,
        "compute_dtype": c.compute_dtype,
        "peak_flops": c.peak_flops,
        "peak_bandwidth": c.peak_bandwidth,
        "ridge": physics.ridge_point(c.peak_flops, c.peak_bandwidth),
    }


def operating_points(c: TargetConstants | None, w: WindowValues | None) -> dict[str, Any]:
    """Decode and prefill on the roofline over window `w` (see the module docstring); None where unknown."""
    out: dict[str, Any] = {"window": w.window if w else None, "decode": None, "prefill": None}
    if c is None or c.model is None or c.gpu is None or w is None:  # no roofs: no point to draw on them
        return out
    decode_flops = _num(w.mfu.get("decode"))
    intensity = _num(w.decode_intensity)
    if decode_flops is not None and intensity:
        out["decode"] = {"intensity": intensity, "flops": decode_flops * c.peak_flops}
    prefill_mfu = _num(w.mfu.get("prefill"))
    prefill_flops = _num(w.flops_per_second.get("prefill"))
    streamed = _num(w.streamed_bytes_per_second)
    if prefill_mfu is not None and prefill_flops and streamed:
        out["prefill"] = {"intensity": prefill_flops / streamed, "flops": prefill_mfu * c.peak_flops}
    return out


def ceilings(c: TargetConstants | None, view: SeriesView) -> list[dict[str, Any]]:
    """The step model's decode ceiling at the current batch and context, and at the batch cap: a decode step of
    that many sequences, each holding the live KV layer-tokens a running sequence holds now, at the roofline of
    the copy's peaks (its FLOPs over its bytes, and the FLOP/s it reaches on the roofs).

    The batch and its live KV are the shortest window's means (the decode point's own inputs, so the
    ceiling sits above it).
    """
    if c is None or c.layout is None or c.roofs is None:  # no profile for this GPU: no ceilings, not another GPU's
        return []
    w = view.windows[0] if view.windows else None
    running = _num(w.mean_running if w and w.mean_running is not None else view.series.running)
    live = _num(w.mean_live_kv_bytes if w and w.mean_live_kv_bytes is not None else view.live_kv_bytes)
    if not running or live is None:
        return []
    layout, roofs = c.layout, c.roofs
    context = layout.layer_tokens_in(live) / running  # KV layer-tokens a running sequence holds
    batches = [("batch", max(1, round(running)))]
    cap = _num(view.batch_max)
    if cap and round(cap) > batches[0][1]:
        batches.append(("cap", int(round(cap))))
    out = []
    for kind, batch in batches:
        cost = layout.cost(Step(decode=Decode(batch, context)))
        seconds = cost.seconds(roofs)
        if not 0 < seconds < math.inf:
            return []
        out.append({
            "kind": kind,
            "batch": batch,
            "context_tokens": round(layout.context_of(context)),
            "intensity": cost.intensity,
            "flops": cost.flops / seconds,
            "tokens_per_second": batch / seconds,
            "step_seconds": seconds,
        })
    return out


# -- the rest of one series ------------------------------------------------------------------------

def detectors(verdicts: Any) -> list[dict[str, Any]]:
    """Every detector (agent/signals/detectors/): active, clear or unknown (the inputs cannot tell), with its
    sentence and runbook, and the numbers and source its verdict carries."""
    out = []
    for d in registered():
        value = getattr(verdicts, d.key, None) if verdicts is not None else None
        state = "unknown" if value is None else ("active" if value else "clear")
        row = {"key": d.key, "title": d.title, "state": state, "sentence": d.sentence,
               "metric": d.flag.metric, "alert": d.alert, "runbook": runbook_url(d.alert)}
        if verdicts is not None:
            row.update({v.attr: _num(getattr(verdicts, v.attr, None)) for v in d.values})
            if d.choice is not None:  # e.g. engine (its buckets) or proxy (exact gaps)
                row[d.choice.attr] = getattr(verdicts, d.choice.attr, None) or d.choice.default
        out.append(row)
    return out


def _shown(values: Mapping[str, Any]) -> dict[str, Any]:
    """Family values (exposition.api_values) as the page shows them: what /metrics would export, else None."""
    return {k: _nums(v) if isinstance(v, Mapping) else _num(v) for k, v in values.items()}


def window_dict(w: WindowValues) -> dict[str, Any]:
    return {"window": w.window, "seconds": w.seconds, **_shown(api_values(family.WINDOW, w))}


def series_dict(target: TargetView, view: SeriesView, history: History | None) -> dict[str, Any]:
    s, c = view.series, target.constants
    shortest = view.windows[0] if view.windows else None
    key = (target.name, s.model, s.rank)
    return {
        "model": s.model,
        "rank": s.rank,
        **_shown(api_values(family.SERIES, view)),
        "live_kv_bytes": _num(view.live_kv_bytes),
        "windows": [window_dict(w) for w in view.windows],
        "operating": operating_points(c, shortest),
        "ceilings": ceilings(c, view),
        "detectors": detectors(view.verdicts),
        "history": history.series(key) if history is not None else None,
    }


def target_dict(snap: Snapshot, target: TargetView, history: History | None) -> dict[str, Any]:
    c = target.constants
    return {
        "name": target.name,
        "engine": target.engine,
        "model": c.model.name if c and c.model else None,
        "model_source": target.model_source,
        "gpu_profile_source": c.gpu_source if c else None,
        "roofline": roofline_dict(c),
        "last_sample": _engine_time(snap, target.name),
        "series": [series_dict(target, v, history) for v in target.series],
    }


def health_dict(h: Health, history: History | None) -> dict[str, Any]:
    seen = history.last_error(h.source, h.target) if history is not None else None
    return {
        # starting: not up yet since the agent started (an engine loading its model), not down
        "source": h.source, "target": h.target, "up": h.up, "starting": h.starting and not h.up,
        "last_success": h.last_success,
        "duration": h.duration, "errors": {k: v for k, v in sorted(h.errors.items()) if v},
        "error_count": sum(h.errors.values()),
        "last_error": {"at": seen[0], "reason": seen[1]} if seen else None,
        "series_dropped": h.series_dropped,
    }


def status_dict(snap: Snapshot, history: History | None = None) -> dict[str, Any]:
    """Everything the status page shows, from one Snapshot (records its errors into `history` first)."""
    if history is not None:
        history.record(snap)
    return {
        "version": __version__,
        "created": snap.created,
        "runbook_base_url": RUNBOOK_BASE_URL,
        "history_fields": list(HISTORY_FIELDS),
        "metric_names": page_names(),  # so the page can say which series each number is
        "health": [health_dict(h, history) for h in snap.health],
        "targets": [target_dict(snap, t, history) for t in snap.targets],
        "gpus": [
            {"index": d.index, "name": d.name, "profile": snap.gpu_profiles.get(d.index),
             "memory_used_bytes": _num(d.memory_used_bytes), "memory_total_bytes": _num(d.memory_total_bytes),
             "kernel_residency_ratio": _num(d.kernel_residency_ratio),
             "dram_bandwidth_utilization_ratio": _num(d.dram_bandwidth_utilization_ratio)}
            for d in (snap.gpu.devices if snap.gpu else ())
        ],
    }


def find_target(status: Mapping[str, Any], name: str | None) -> Mapping[str, Any] | None:
    """The named target's part of a status dict (the first when `name` is None)."""
    targets: Iterable[Mapping[str, Any]] = status.get("targets", ())
    for t in targets:
        if name is None or t["name"] == name:
            return t
    return None
