"""The few helpers every engine adapter needs, written once.

- Values: nothing an engine exports (counts, tokens, seconds, ratios) can be negative, NaN or
  infinite; such a value is no value (None), so it never poisons a rate downstream.
- Recognising a page: an engine is known by the prefix of its families.
- Combining the series one logical value is split into (one per process in prometheus_client's
  multiprocess mode, one per label the adapter does not key on): gauges mirror one engine state,
  so they take the maximum; counters count apart, so they are summed.
- Info endpoints: the decoded JSON is read defensively; a field that is absent, null, zero,
  negative or not a number is no value (docs/engines.md "Model and batch cap: info endpoints").
  A number past its plausible bound (TP above MAX_TENSOR_PARALLEL, a batch cap above MAX_BATCH, a KV
  pool above MAX_KV_BLOCKS blocks) is no value either, and counted as INFO_OUT_OF_RANGE: one absurd
  `num_gpu_blocks="1e308"` made an infinite pool and a zero ceiling in the physics. Strings are cut
  to MAX_INFO_CHARS (expfmt.TRUNCATED_MARK marks the cut): they become label values and log text.
- Bounds: what reading one page may cost the agent (`page_bounds`, docs/reliability.md "Bounds on
  what an engine can cost").
"""

from __future__ import annotations

import math
from typing import Any, Collection, Hashable, Iterable, Mapping, TypeVar

from rooflight.collectors import expfmt
from rooflight.collectors.errors import ParseError
from rooflight.collectors.samples import EngineInfoHints

HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
K = TypeVar("K", bound=Hashable)

# Samples an adapter may create from one page, per (model, rank) series the agent keeps (max_series).
# A real series is read from 3 to 119 samples (vLLM's 119: five histograms and its counters and gauges;
# measured on every page in tests/fixtures/engine-samples/), times the API-server processes where a
# `pid` label splits it; 256 leaves that room, and the floor a little more for a small max_series.
SAMPLES_PER_SERIES = 256
# The default cap on an engine's /metrics body. The largest real page is vLLM's, ~35 KB per
# data-parallel rank plus ~20 KB once (tests/fixtures/engine-samples/vllm-*.prom), ~46 KB per rank
# with a 40-character model name: 64 ranks behind one API server and a thousand LoRA adapter sets
# still fit under 4 MiB. Reading and parsing a page costs about three times its size at the peak
# (bytes, text, samples), so this cap is also what keeps the agent under 100 MB of RSS whatever a
# page holds (docs/reliability.md "Bounds on what an engine can cost").
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
MIN_PAGE_SAMPLES = 4096
# Labels per sample, on average over the page: real ones carry 2 to 5 (vLLM's cache_config_info 74,
# once per rank); what a sample costs in memory grows with its labels, not with the line's length.
LABELS_PER_SAMPLE = 4

# Info values: strings are cut as expfmt cuts label values; numbers past these bounds are refused.
MAX_INFO_CHARS = expfmt.MAX_LABEL_VALUE_CHARS
INFO_OUT_OF_RANGE = "info_out_of_range"  # the reason a refused info value is counted under
MAX_TENSOR_PARALLEL = 1024  # GPUs one model is split over: an NVL72 rack is 72
MAX_BATCH = 1_000_000  # sequences in one batch (real caps: 256 to a few thousand)
MAX_CONTEXT_TOKENS = 1 << 30  # a context window (the longest real ones: 10M tokens)
MAX_KV_BLOCKS = 1_000_000_000  # KV blocks in one pool (an 80 GB pool of 16-token blocks: ~1e5)
MAX_KV_BLOCK_TOKENS = 1 << 20  # tokens per KV block (real: 1 to 256)
MAX_KV_TOKENS = MAX_KV_BLOCKS * 16.0  # a pool's tokens, where the engine states them directly


def page_bounds(max_series: int) -> expfmt.Bounds:
    """Fresh Bounds for one scrape of one engine: samples and labels capped for `max_series` series,
    label values cut."""
    samples = max(MIN_PAGE_SAMPLES, SAMPLES_PER_SERIES * max_series)
    return expfmt.Bounds(max_samples=samples, max_labels=LABELS_PER_SAMPLE * samples)


def read_page(text: str, prefixes: tuple[str, ...], names: Collection[str], *, what: str = "") -> expfmt.Selection:
    """The samples an adapter reads (`names`, all starting with one of `prefixes`) from a page;
    ParseError naming `what` (default: the prefixes) when the page holds none of them."""
    exp = expfmt.select(text, names, prefixes=prefixes)
    if not exp.names():
        raise ParseError(f"no {what or ' or '.join(prefixes)} metric families in the exposition")
    return exp


def good(value: float) -> bool:
    """True for a finite, non-negative value (False for NaN, +-Inf and negatives)."""
    return 0.0 <= value < math.inf


def number(text: str | None) -> float | None:
    """A finite, non-negative number from a label value ('None', '', junk -> None)."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if good(value) else None


def combine(values: Iterable[float], *, gauge: bool) -> float | None:
    """One value from the parts of a split series: max for a gauge, sum for a counter; bad parts dropped."""
    kept = [v for v in values if good(v)]
    if not kept:
        return None
    if gauge:
        return max(kept)
    try:
        return math.fsum(kept)
    except OverflowError:  # parts that sum past the largest float: no number, as an infinite one is none
        return None


def combine_each(groups: Mapping[K, Mapping[Any, float]], *, gauge: bool) -> dict[K, float]:
    """combine() over the parts of each group (e.g. per (model, rank), its values per pid); a group
    without one good part is left out."""
    out: dict[K, float] = {}
    for key, parts in groups.items():
        value = combine(parts.values(), gauge=gauge)
        if value is not None:
            out[key] = value
    return out


def within(value: float | None, upper: float) -> float | None:
    """The value if it is above 0 and at most `upper`; else None, and counted (INFO_OUT_OF_RANGE) when
    a value was stated. Zero is no pool and no cap: a ceiling computed from it would divide by zero."""
    if value is None:
        return None
    if 0.0 < value <= upper:
        return value
    expfmt.drop_value(INFO_OUT_OF_RANGE)
    return None


def product(a: float | None, b: float | None) -> float | None:
    """a x b where both are stated (blocks x tokens per block), else None."""
    return a * b if a is not None and b is not None else None


def histogram_names(*bases: str) -> set[str]:
    """The wire names of histograms: `<base>_bucket`, `_count`, `_sum` for each base."""
    return {base + suffix for base in bases for suffix in HISTOGRAM_SUFFIXES}


def has_samples(text: str, *prefixes: str) -> bool:
    """True when a sample line starts with one of the prefixes."""
    return any(text.startswith(p) or "\n" + p in text for p in prefixes)


def has_families(text: str, *prefixes: str) -> bool:
    """True when a sample line or a `# TYPE` line names a family with one of the prefixes."""
    return has_samples(text, *prefixes) or any("# TYPE " + p in text for p in prefixes)


# --- info endpoints ---------------------------------------------------------------------------------


def count(value: Any, upper: int = MAX_BATCH) -> int | None:
    """A positive whole number up to `upper` (JSON int, or a float/str holding one), else None; one
    past `upper` is counted as INFO_OUT_OF_RANGE (`"tp_size": 1e308` is no TP)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or value <= 0:
        return None
    if value > upper:
        expfmt.drop_value(INFO_OUT_OF_RANGE)
        return None
    return value


def cut(text: str, limit: int = MAX_INFO_CHARS) -> str:
    """`text` cut to `limit` characters plus expfmt.TRUNCATED_MARK where longer."""
    return text if len(text) <= limit else text[:limit] + expfmt.TRUNCATED_MARK


def nonblank(value: Any) -> str | None:
    """A non-blank string, cut to MAX_INFO_CHARS (it becomes a label value and log text), else None."""
    return cut(value) if isinstance(value, str) and value.strip() else None


def as_dict(value: Any) -> dict:
    """The value if it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def first_of(value: Any) -> dict:
    """The first element of a JSON list when it is an object, else an empty one."""
    return as_dict(value[0]) if isinstance(value, list) and value else {}


def openai_models_info(data: Any) -> EngineInfoHints:
    """OpenAI `/v1/models`: `data[0].root` (the model path; `id`, the served name, without it) and
    `data[0].max_model_len` where the server adds it (vLLM). Nothing about the batch there."""
    entry = first_of(as_dict(data).get("data"))
    return EngineInfoHints(
        model_id=nonblank(entry.get("root")) or nonblank(entry.get("id")),
        max_model_len=count(entry.get("max_model_len"), MAX_CONTEXT_TOKENS),
    )


def no_info(data: Any) -> EngineInfoHints:
    """For an engine without an info endpoint: no hints."""
    return EngineInfoHints()
