"""`rooflight demo --fault`: the simulated engine fails on a schedule, as real ones do, for its agent to see.

    KIND@START[:FOR]          e.g. hang@30s, 503@20s, down@0s:24s, gpu-lost@30s
    crash-loop@START:DOWN:UP  e.g. crash-loop@20s:15s:3s
    5xx@START:SHARE           e.g. 5xx@30s:5%

- `hang`: the engine stops stepping, holding its requests; its /metrics still answers (frozen) and a
  completion request is never answered. The stall the canary confirms.
- `stuck-gauges`: every client gives up at once and no request arrives after; the engine is idle but its
  page keeps the running count it had (vLLM's gauges after a mass abort), until a completion request
  (the canary) runs a step and refreshes them.
- `503`: every route answers 503 (an engine whose core died behind its API server).
- `down`: nothing listens on the engine's port (connection refused), for FOR or for good; when it listens
  again it is a new process, its counters from 0. `down@0s:24s` is a model load.
- `crash-loop`: down for DOWN, up for UP, again, from START.
- `gpu-lost`: the simulated GPU falls off the bus (the fake NVML answers GPU_IS_LOST) and the engine on it
  dies (down for good).
- `5xx`: from START, SHARE of the requests the engine finishes are answered 5xx (its API server's
  `http_requests_total{status="5xx"}`, as vLLM's instrumentator counts them).

Times are wall seconds from the demo's start; `FOR` omitted is for good.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from rooflight.agent.config.values import parse_duration
from rooflight.agent.errors import ConfigError

KINDS = ("hang", "stuck-gauges", "503", "down", "crash-loop", "gpu-lost", "5xx")
_SPEC = re.compile(r"^(?P<kind>[a-z0-9-]+)@(?P<start>[^:]+)(?::(?P<rest>.+))?$")


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    start: float  # seconds from the demo's start
    length: float = math.inf  # how long it lasts (down, 503, hang, stuck-gauges); crash-loop: its down time
    up: float = 0.0  # crash-loop: how long it is up between crashes
    share: float = 0.0  # 5xx: the share of finished requests answered 5xx


def _seconds(text: str, spec: str) -> float:
    if text.strip() in ("0", "0s"):
        return 0.0
    try:
        return float(parse_duration(text, "--fault"))
    except ConfigError:
        raise ConfigError(f"--fault {spec!r}: {text!r} is not a duration like 30s") from None


def parse_fault(spec: str) -> Fault:
    """One --fault value; ConfigError naming what to write otherwise."""
    m = _SPEC.match(spec.strip())
    if not m or m["kind"] not in KINDS:
        raise ConfigError(f"--fault {spec!r}: write KIND@START[:FOR] (KIND one of {', '.join(KINDS)}), "
                          "or crash-loop@START:DOWN:UP, e.g. hang@30s or crash-loop@20s:15s:3s")
    kind, start, rest = m["kind"], _seconds(m["start"], spec), (m["rest"] or "").split(":") if m["rest"] else []
    if kind == "crash-loop":
        if len(rest) != 2:
            raise ConfigError(f"--fault {spec!r}: crash-loop takes START:DOWN:UP, e.g. crash-loop@20s:15s:3s")
        down, up = (_seconds(x, spec) for x in rest)
        if down <= 0 or up <= 0:
            raise ConfigError(f"--fault {spec!r}: DOWN and UP must be longer than 0s")
        return Fault(kind, start, down, up)
    if kind == "5xx":
        try:
            share = float(rest[0].rstrip("%")) / 100 if len(rest) == 1 and rest[0].endswith("%") else -1.0
        except ValueError:
            share = -1.0
        if not 0.0 < share <= 1.0:
            raise ConfigError(f"--fault {spec!r}: 5xx takes START:SHARE, e.g. 5xx@30s:5%")
        return Fault(kind, start, share=share)
    if len(rest) > 1 or (kind == "gpu-lost" and rest):
        raise ConfigError(f"--fault {spec!r}: {kind} takes START" + ("" if kind == "gpu-lost" else "[:FOR]"))
    return Fault(kind, start, _seconds(rest[0], spec) if rest else math.inf)


def listening(faults: tuple[Fault, ...], t: float) -> bool:
    """Whether the engine's port is bound at `t` seconds from the start."""
    for f in faults:
        if f.kind in ("down", "gpu-lost") and f.start <= t < f.start + f.length:
            return False
        if f.kind == "crash-loop" and t >= f.start and (t - f.start) % (f.length + f.up) < f.length:
            return False
    return True


def active(faults: tuple[Fault, ...], kind: str, t: float) -> bool:
    """Whether a fault of `kind` holds at `t` seconds from the start."""
    return any(f.kind == kind and f.start <= t < f.start + f.length for f in faults)
