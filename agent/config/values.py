"""One setting's value as written (a flag, an environment variable or a YAML value) -> a checked value.

Each parser takes the value and `what` (how the user spelt the setting, for the message) and raises
ConfigError saying what to fix.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Callable, Mapping, Sequence

from rooflight.agent.errors import ConfigError

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
MAX_DURATION_SECONDS = 86400.0  # a day: longer than any window or timeout the agent has a use for


def parse_duration(value: Any, what: str) -> float:
    """'10s', '1m', '250ms' or a number of seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value).strip())
        if not match:
            raise ConfigError(f"{what}: {value!r} is not a duration; write e.g. 1s, 250ms, 1m or 0.5")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if not math.isfinite(seconds):
        raise ConfigError(f"{what}: {value!r} is not a finite duration; write e.g. 1s, 250ms or 1m")
    if seconds <= 0:
        raise ConfigError(f"{what}: must be more than zero, got {value!r}")
    if seconds > MAX_DURATION_SECONDS:
        raise ConfigError(f"{what}: {value!r} is longer than a day; write a shorter duration")
    return seconds


def split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen address {listen!r}: write HOST:PORT, e.g. 127.0.0.1:9746 or 0.0.0.0:9746")
    return host.strip("[]") or "0.0.0.0", int(port)


WILDCARD_HOSTS = ("0.0.0.0", "::", "")  # a listener on one of these holds its port on every address


def listens_clash(listen: str, other: str) -> bool:
    """Whether two HOST:PORT listeners cannot both bind: one port (not 0, any free one) on one host, or on a
    wildcard and any address (0.0.0.0:8100 holds 127.0.0.1:8100 too)."""
    host, port = split_listen(listen)
    other_host, other_port = split_listen(other)
    return bool(port) and port == other_port and (
        host == other_host or host in WILDCARD_HOSTS or other_host in WILDCARD_HOSTS)


def written_number(value: Any) -> Any:
    """`value`, unless it is text with an underscore or a digit outside ASCII: Python's int() and float() read
    '1_0' as 10 and a full-width '１０' as 10, slips no config, flag or environment variable means."""
    if isinstance(value, str) and ("_" in value or not value.isascii()):
        raise ValueError(value)
    return value


def positive_int(value: Any, what: str) -> int:
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(value)
        number = int(written_number(value))
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{what}: {value!r} is not a whole number") from None
    if number < 1:
        raise ConfigError(f"{what}: must be at least 1, got {number}")
    return number


# The most each count of `rooflight run` may be (what it counts cannot be more; a typo of extra digits, or a
# 1e21 from a template, stops the start instead of being exported as given)
MAX_EXPERT_PARALLEL = 65_536  # GPUs one model's routed experts are spread over (real: 8 to a few hundred)
MAX_PID = 4_194_304  # Linux's PID_MAX_LIMIT
MAX_BODY_BYTES = 1 << 30  # an engine page read (default 4 MiB)
MAX_SERIES = 10_000  # (model, rank) series tracked per target (default 128), each a history in memory
MAX_CONNECTIONS = 1_000_000  # connections open to the agent at once (default 256)


def count_within(high: int, advice: str) -> Callable[[Any, str], int]:
    """A parser of a whole number from 1 to `high` (positive_int's checks, then the upper bound); past it the
    message gives the bound and `advice`, what to write."""

    def parse(value: Any, what: str) -> int:
        number = positive_int(value, what)
        if number > high:
            raise ConfigError(f"{what}: {number} is more than {high:,}; {advice}")
        return number

    return parse


def whole(value: Any, what: str) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ConfigError(f"{what}: {value!r} is not a whole number")
    try:
        return int(written_number(value))
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{what}: {value!r} is not a whole number") from None


def finite(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError("a bool is not a threshold")
    number = float(written_number(value))
    if not math.isfinite(number):
        raise ValueError("not finite")
    return number


def parse_bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{what}: {value!r} is not true or false")


def optional_path(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ConfigError(f"{what}: {value!r} is not a file path; write e.g. {what}: /etc/rooflight/web.yml")
    return str(value)


def log_file(value: Any, what: str) -> str | None:
    """A file to append to: its directory must exist (checked by --check-only too); the open is the writer's."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ConfigError(f"{what}: {value!r} is not a file path; write e.g. {what} /var/log/rooflight/requests.jsonl")
    path = str(value)
    if os.path.isdir(path):
        raise ConfigError(f"{what} {path}: is a directory; name a file in it, e.g. {what} "
                          f"{os.path.join(path, 'requests.jsonl')}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ConfigError(f"{what} {path}: there is no directory {parent}; create it or choose another")
    return path


def dtype(value: Any, what: str) -> str:
    """`weight_dtype`, `kv_dtype`: a dtype the roofline knows (bf16, fp8, bfloat16, fp8_e4m3, ...), checked at
    start; unchecked, `--weight-dtype fp3` passed --check-only and stopped the engine loop with a traceback."""
    from rooflight.agent.roofline.models import DTYPE_BYTES, normalize_dtype  # the roofline's own names

    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what} (--{what.replace('_', '-')}): {value!r} is not a dtype; write one of "
                          f"{', '.join(DTYPE_BYTES)}")
    try:
        normalize_dtype(value)
    except ConfigError:
        raise ConfigError(f"{what} (--{what.replace('_', '-')}): unknown dtype {value!r}; write one of "
                          f"{', '.join(DTYPE_BYTES)}") from None
    return value.strip()


GPU_SCOPES = ("own", "all")


def gpu_scope(value: Any, what: str = "gpus") -> str:
    """`gpus`: own (each sidecar its engine's GPUs) or all (every GPU the agent sees: a node-level agent)."""
    scope = value.strip().lower() if isinstance(value, str) else value
    if scope not in GPU_SCOPES:
        raise ConfigError(f"gpus: {value!r}: write own (the GPUs of the targets' engines, the default) "
                          "or all (every GPU on the node)")
    return str(scope)


def detector_thresholds(value: Any, what: str = "detectors") -> dict[str, float]:
    """`detectors:` is a mapping of threshold names to numbers, e.g. {hol_inflation: 4}."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError("detectors: write a mapping of threshold names to numbers, e.g."
                          " `detectors: {hol_inflation: 4}` (or --detector hol_inflation=4)")
    out = {}
    for key, number in value.items():
        try:
            out[str(key)] = finite(number)
        except (TypeError, ValueError):
            raise ConfigError(f"detectors.{key}: {number!r} is not a number; write e.g. {key}: 4") from None
    return out


def spellings(value: Any, what: str) -> tuple[str, ...]:
    """SLOs or bucket edges as strings: one, a list, `;`-separated (the environment), or YAML mappings.

    A mapping is written back as the flag spells it: {ttft: 0.5, tpot: 50ms} -> "ttft=0.5,tpot=50ms"."""
    if value is None:
        return ()
    items = value.split(";") if isinstance(value, str) else value
    if isinstance(items, Mapping):
        items = [items]
    if not isinstance(items, (list, tuple)):
        raise ConfigError(f"{what}: write a string, a list of strings or a list of mappings, got {value!r}")
    out = []
    for item in items:
        if isinstance(item, Mapping):
            item = ",".join(f"{k}={v}" for k, v in item.items())
        if not isinstance(item, (str, int, float)) or isinstance(item, bool):
            raise ConfigError(f"{what}: {item!r} is not a spelling like ttft=0.5,tpot=0.05")
        if str(item).strip():
            out.append(str(item).strip())
    return tuple(out)


def _items(value: Any, what: str) -> list[Any]:
    """A comma-separated string or a list, as the flags and the YAML file spell lists."""
    if isinstance(value, str):
        return value.split(",")
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ConfigError(f"{what}: write a comma-separated list or a YAML list, got {value!r}")


def parse_windows(value: Any, what: str = "windows") -> dict[str, float]:
    """`10s,1m,5m` (or a YAML list): each window's name and its seconds."""
    items = _items(value, what)
    windows = {str(w).strip(): parse_duration(str(w).strip(), what) for w in items if str(w).strip()}
    if not windows:
        raise ConfigError(f"{what}: give at least one, e.g. 10s,1m,5m")
    return windows


def parse_percentiles(value: Any, what: str = "percentiles", required: bool = False) -> tuple[str, ...]:
    """`50,90,99` (or a YAML list): each percentile as its label value, once."""
    out = []
    for item in _items(value, what):
        text = str(item).strip()
        if not text:
            continue
        try:
            number = float(written_number(text))
        except ValueError:
            raise ConfigError(f"{what}: {text!r} is not a number between 0 and 100") from None
        if not 0 < number < 100:
            raise ConfigError(f"{what}: {text} must be between 0 and 100 (exclusive)")
        out.append(f"{number:g}")
    if required and not out:
        raise ConfigError(f"{what}: give at least one, e.g. 50,90,99")
    return tuple(dict.fromkeys(out))


ROLES = ("both", "prefill", "decode")  # as agent/signals/headroom.py names them


def role(value: Any, what: str = "role") -> str:
    """A target's part in disaggregated serving: prefill, decode or both."""
    if str(value).strip().lower() not in ROLES:
        raise ConfigError(f"{what} {value!r}: choose one of {', '.join(ROLES)} (a disaggregated pool's part)")
    return str(value).strip().lower()


def gpu_hour_cost(value: Any, what: str = "gpu_hour_cost") -> float:
    """The price of one GPU-hour, any currency: above 0."""
    try:
        price = finite(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: {value!r} is not a number; write the price of one GPU-hour, e.g. 2.5") from None
    if price <= 0:
        raise ConfigError(f"{what}: must be above 0, got {value!r}")
    return price


def bounded_whole(value: Any, what: str, low: int, high: int, why: str = "") -> int:
    """A whole number from low to high (a count or a cap of the proxy's)."""
    try:
        number = int(written_number(value))
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: {value!r} is not a whole number") from None
    if not low <= number <= high:
        raise ConfigError(f"{what}: {number} must be between {low} and {high}{why}")
    return number


def label_count(value: Any, what: str) -> int:
    """How many values of a label are named (the rest are `other`): each is a label value on several series."""
    return bounded_whole(value, what, 0, 1000, " (each is a label value on several series)")


def connection_cap(value: Any, what: str) -> int:
    return bounded_whole(value, what, 1, 1_000_000)


def port_timeout(value: Any, what: str) -> float:
    """A timeout of the proxy's port: a duration from 1 ms to 1 h."""
    seconds = parse_duration(value, what)
    if not 0 < seconds <= 3600:
        raise ConfigError(f"{what}: {seconds:g} s: give a time between 1ms and 1h, e.g. {what} 10s")
    return seconds


def header_name(value: Any, what: str) -> str | None:
    """An HTTP header's name, e.g. X-Tenant-Id (None: not given)."""
    if value is None:
        return None
    name = str(value).strip()
    if not name or any(ch in name for ch in " :\t\r\n"):
        raise ConfigError(f"{what} {name!r}: give a header name, e.g. X-Tenant-Id")
    return name


def required_percentiles(value: Any, what: str) -> tuple[str, ...]:
    return parse_percentiles(value, what, required=True)


def detector_flags(items: Sequence[str]) -> dict[str, float]:
    """--detector KEY=NUMBER items (repeated) as the `detectors` mapping."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            out[key.strip()] = float(written_number(value))
        except ValueError:
            raise ConfigError(f"--detector {item!r}: write KEY=NUMBER, e.g. hol_inflation=4") from None
        if not sep:
            raise ConfigError(f"--detector {item!r}: write KEY=NUMBER, e.g. hol_inflation=4")
    return out
