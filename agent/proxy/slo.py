"""Service-level objectives and goodput, as DistServe defines it: a request is good when it meets every target.

An SLO is written `ttft=0.5,tpot=0.05` (seconds; `500ms` works too); its targets are joint, so a request
with a fast first token but slow decoding is not good. Keys: `ttft` (time to first token), `itl` (the
longest gap between two token chunks of the request: every gap within the target), `tpot` (time per
output token after the first: (last token - first token) / (output tokens - 1)), `e2e` (end-to-end). A
value equal to its target meets it.

Against `vllm bench serve --goodput "ttft:150 tpot:9.4"` (its keys ttft, tpot, e2el, in ms): the same
verdict for ttft and tpot, `<=` as here, TPOT 0 (met) for one output token, only successful streams can be
good; its goodput is good requests / the run's duration, the increase of
`rooflight_client_slo_good_requests_total` over the run here. It has no ITL key; `itl` applies the rule
above to each request's list of gaps (its detailed results' `itls`). Its e2el ends at the last chunk with
choices, this e2e at the response's last byte (the usage chunk and `[DONE]` after it).

Which requests are judged (the denominator): streamed requests on the inference routes, except those the
client abandoned (they never finished, so neither verdict is known) and those the client got wrong (4xx
other than 429). Errors, 429s and responses broken off upstream are judged and are not good. A stream
with one output token has no TPOT and meets any TPOT target, as in vLLM's benchmark tools. Non-streamed
requests are not judged: the client sees no first token before the whole answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from rooflight.agent.errors import ConfigError
from rooflight.agent.proxy.tracker import CLIENT_DISCONNECTED, RequestRecord
from rooflight.agent.config.values import parse_duration

KEYS = ("ttft", "tpot", "e2e", "itl")  # the order of the error message


@dataclass(frozen=True, slots=True)
class SLO:
    name: str  # the canonical spelling, also the `slo` label value
    targets: tuple[tuple[str, float], ...]  # (key, seconds), in the order given

    def target(self, key: str) -> float | None:
        return dict(self.targets).get(key)


def parse_slo(text: str) -> SLO:
    """`ttft=0.5,tpot=0.05` -> SLO; a bad spelling raises ConfigError saying how to write it."""
    targets: dict[str, float] = {}
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in KEYS:
            raise ConfigError(f"--slo {text!r}: write KEY=SECONDS pairs joined by commas, keys {', '.join(KEYS)}; "
                              "e.g. --slo ttft=0.5,tpot=0.05")
        if key in targets:
            raise ConfigError(f"--slo {text!r}: {key} is given twice")
        targets[key] = parse_duration(value.strip(), f"--slo {key}")
    if not targets:
        raise ConfigError(f"--slo {text!r}: give at least one target, e.g. --slo ttft=0.5,tpot=0.05")
    pairs = tuple(targets.items())
    return SLO(",".join(f"{k}={v:g}" for k, v in pairs), pairs)


def parse_slos(items: list[str] | tuple[str, ...] | None) -> tuple[SLO, ...]:
    out: list[SLO] = []
    for item in items or ():
        slo = parse_slo(item)
        if any(s.name == slo.name for s in out):
            raise ConfigError(f"--slo {item!r} is given twice")
        out.append(slo)
    return tuple(out)


def judged(record: RequestRecord) -> bool:
    """Whether a request counts in the goodput denominator (see the module docstring)."""
    if not record.inference or record.outcome == CLIENT_DISCONNECTED:
        return False
    if record.status is not None and 400 <= record.status < 500 and record.status != 429:
        return False
    if record.ok:
        return record.stream
    return True  # errors count against goodput whether or not the client asked for a stream


def meets(slo: SLO, record: RequestRecord) -> bool:
    """Good: a finished, successful stream within every target of the SLO."""
    if not record.ok or not record.stream or record.finish_reason in ("upstream_error", "abort"):
        return False
    for key, limit in slo.targets:
        if key == "ttft":
            if record.ttft is None or record.ttft > limit:
                return False
        elif key == "tpot":
            tpot = record.tpot
            if tpot is not None and tpot > limit:
                return False
            if tpot is None and record.ttft is None:
                return False  # no output at all
        elif key == "itl":
            if record.ttft is None:
                return False  # no output at all
            worst = record.itl_max
            if worst is not None and worst > limit:
                return False  # one token: no gap, met (as TPOT is)
        elif key == "e2e" and record.e2e > limit:
            return False
    return True
