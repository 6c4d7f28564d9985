"""A fast, tolerant reader of the Prometheus text exposition format, shared by every engine adapter.

Why this exists (measured, not assumed): `prometheus_client.parser.text_string_to_metric_families`
takes 12-21 ms (depending on machine load) for the 55 kB / 630-line vLLM capture
`vllm-cpu-load-c16.prom` on the project's 2-core machine: it walks label strings character by
character in Python. Sampling at 10 Hz next to a busy engine would spend up to a fifth of a core on
parsing alone. This reader makes one pass over the lines with C-level string methods, parses labels
with `split`/`partition` (a regex only for the rare line with escapes or odd spacing), remembers the
name+labels text of series it has seen (label sets are stable between scrapes), and can skip
families by name before touching their labels. Measured on the same page and machine: 1.4-2.3 ms
unfiltered, 0.6-1.2 ms with the vLLM adapter's filter; `bench/bench_sampling.py` prints the
current numbers and ratios. The adapters read with `select()`, which finds the lines of the names they
read with one regular expression and gives the same samples as parse()'s `by_name` (0.24 ms on that
page, against 0.38 ms for parse() with the same filter, which steps through every line to group
families as prometheus_client does).

It gives the same samples as prometheus_client's parser on every page in
`tests/fixtures/engine-samples/` and on expositions rendered by prometheus_client
(tests/collectors/test_expfmt.py), with these documented differences, all in the direction of
tolerance:
- a line that does not parse is counted in `bad_lines` and skipped (prometheus_client raises);
  `parse` raises ParseError only when lines were bad and not one sample parsed;
- an exemplar (` # {...} v`) after the value is dropped; `# EOF` and other comments are ignored;
- sample names keep their wire spelling (prometheus_client renames samples of a counter family
  declared without `_total`; `Family.type` lets a caller do the same);
- values are always floats (prometheus_client returns an int for an integer literal; equal in value).
Timestamps after the value are milliseconds on the wire and seconds here, as in prometheus_client.

Family grouping follows prometheus_client: a `# HELP`/`# TYPE` line opens a family; a sample whose
name is not one the family's type allows (`_bucket`/`_count`/`_sum` for histograms, `_count`/`_sum`
and the bare name for summaries) becomes a family of its own; untyped families have type "unknown"
(the OpenMetrics spelling prometheus_client uses).

Every Sample gets its own labels dict (copied from the cache of already-seen series).

Bounds (docs/reliability.md "Bounds on what an engine can cost"): a page is split a block of lines
at a time (a 16 MB page never becomes 260k line strings at once) and label names are interned. Under
`Bounds` (the agent sets them per scrape with `bounded()`) at most `max_samples` samples and
`max_labels` labels are created, the wanted lines past them only counted; label values longer than
MAX_LABEL_VALUE_CHARS are cut to that length plus TRUNCATED_MARK, and counted; a run of untyped
samples of one name makes one Family, not one each (nothing in the agent reads families: 4 MB less
for 32k samples). Without Bounds the reader is exact, as the comparisons above need.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import types
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from sys import intern
from typing import Callable, Collection, Hashable, Iterable, Iterator, Mapping, NamedTuple, TypeVar

from rooflight.collectors.errors import ParseError
from rooflight.collectors.samples import Histogram

__all__ = ["Sample", "Family", "Exposition", "Selection", "Bounds", "bounded", "parse", "select", "histograms",
           "drop_value"]

INF = float("inf")
K = TypeVar("K", bound=Hashable)


class Sample(NamedTuple):
    """One line of the exposition: wire name, labels, value, timestamp in seconds (or None)."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None


_new_sample = tuple.__new__  # Sample's own __new__ is a Python function: one frame per sample saved


@dataclass(slots=True)
class Family:
    """Samples grouped the way prometheus_client groups them; `name` as in the TYPE/HELP line."""

    name: str
    type: str
    help: str
    samples: list[Sample] = field(default_factory=list)


@dataclass(slots=True)
class Exposition:
    """One parsed exposition. `by_name` indexes samples by wire name, in order of appearance."""

    families: list[Family]
    by_name: dict[str, list[Sample]]
    bad_lines: int = 0
    samples_dropped: int = 0  # wanted samples not created: the Bounds' max_samples or max_labels was reached
    labels_truncated: int = 0  # label values cut to MAX_LABEL_VALUE_CHARS under Bounds

    def get(self, name: str) -> list[Sample]:
        """Samples with this exact wire name (empty list if none)."""
        return self.by_name.get(name, [])

    def __len__(self) -> int:
        return sum(len(f.samples) for f in self.families)


@dataclass(slots=True)
class Selection:
    """The samples of the names an adapter reads, by wire name in page order (select()).

    On a page read as one read before (`layout`), a name's samples are made when first asked for, and a plan
    made on the layout (planned(): histograms()', an adapter's) reads `values` by line instead: an adapter
    whose tables are all planned makes no Sample for them (measured: see planned())."""

    samples_made: dict[str, list[Sample]]  # by wire name: every name's, or on a layout's page those asked for so far
    bad_lines: int = 0  # lines of those names that did not parse
    layout: _Layout | None = None  # the layout of a page read as one read before
    values: list[float] | None = None  # with `layout`: each found line's value, in page order

    @property
    def by_name(self) -> dict[str, list[Sample]]:
        """Samples by wire name, in page order (on a layout's page, every name's made now)."""
        if self.layout is not None and len(self.samples_made) < len(self.layout.runs):
            self.samples_made = {name: self.get(name) for name in self.layout.runs}
        return self.samples_made

    def get(self, name: str) -> list[Sample]:
        """Samples with this exact wire name (empty list if none)."""
        found = self.samples_made.get(name)
        if found is None:
            if self.layout is None or name not in self.layout.runs:
                return []
            found = self.samples_made[name] = _laid_out(self.layout, self.values, name)  # type: ignore[arg-type]
        return found

    def names(self) -> Collection[str]:
        """The wire names found (none of their samples made)."""
        return self.layout.runs.keys() if self.layout is not None else self.samples_made.keys()

    def lines(self, name: str) -> list[int]:
        """On a layout's page, the line (index into `values`) of each of the name's samples, in get()'s order."""
        assert self.layout is not None
        return [i for first, end in self.layout.runs.get(name, ()) for i in range(first, end)]


# A label value longer than this is cut (under Bounds): an engine's model names, reasons and bucket
# bounds are tens of characters; a 15 MB `model_name` would otherwise be copied into every series the
# agent exports (126 MB /metrics, measured). Prometheus' own `label_value_length_limit` is the model.
MAX_LABEL_VALUE_CHARS = 128
TRUNCATED_MARK = "…[truncated]"

# A histogram with more buckets than this is dropped (and counted under Bounds): real engines export
# under 50 (vLLM's widest, request_prompt_tokens, has 26), and one with 30,000 bounds that move a little on
# every page kept a new layout per point of the agent's history (84 -> 277 MB in 150 s, measured).
MAX_HISTOGRAM_BUCKETS = 256
HISTOGRAM_TOO_MANY_BUCKETS = "histogram_too_many_buckets"  # the reason it is counted under

# Lines are split this many characters at a time: the line strings of one block exist at once, not
# those of the whole page (a 16 MB page is ~260k lines, ~30 MB of string objects).
_BLOCK_CHARS = 1 << 20


@dataclass(slots=True)
class Bounds:
    """What reading one scrape may cost, and what those limits cut.

    Shared by every parse call made under it (one scrape may parse more than once); the counts are
    what the agent exports per engine source.
    """

    max_samples: int | None = None  # samples created under these bounds, over all parse calls
    # Labels of those samples: memory follows labels more than samples (a line can carry a hundred).
    max_labels: int | None = None
    truncate_labels: bool = True  # cut label values over MAX_LABEL_VALUE_CHARS, with TRUNCATED_MARK
    samples: int = 0  # created so far
    labels: int = 0  # created so far
    samples_dropped: int = 0  # wanted samples past max_samples or max_labels, counted and not created
    labels_truncated: int = 0
    # Values an adapter refused while reading under these bounds (a histogram with too many buckets, an
    # implausible info value), by reason: the agent counts them in rooflight_source_values_dropped_total.
    values_dropped: dict[str, int] = field(default_factory=dict)


_BOUNDS: ContextVar[Bounds | None] = ContextVar("rooflight_expfmt_bounds", default=None)


@contextmanager
def bounded(bounds: Bounds) -> Iterator[Bounds]:
    """Apply `bounds` to every parse() in this context (an adapter's, inside the agent's scrape).

    A context variable, not an argument, because the engine adapters call parse() themselves; it
    follows the scrape into asyncio.to_thread, which copies the context.
    """
    token = _BOUNDS.set(bounds)
    try:
        yield bounds
    finally:
        _BOUNDS.reset(token)


def drop_value(reason: str) -> None:
    """Count a value refused while reading a page or an info endpoint, under the current Bounds (if any).

    A context variable, as Bounds are: the adapters are pure functions with nowhere else to say it.
    """
    limits = _BOUNDS.get()
    if limits is not None:
        limits.values_dropped[reason] = limits.values_dropped.get(reason, 0) + 1


_ALLOWED_SUFFIXES = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}

# Slow path for one label pair: optional spaces, name, '=', quoted value with escapes, separator.
# The value pattern is `(?:[^"\\]|\\.)*` unrolled: a long value costs one scan, not a branch per character.
_LABEL_RE = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"([^"\\]*(?:\\.[^"\\]*)*)"\s*(,|\})', re.S)
_ESCAPE_RE = re.compile(r'\\[\\n"]')
_HELP_ESCAPE_RE = re.compile(r"\\[\\n]")
_UNESCAPE = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_NAME_RE = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*\Z")
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")

# Name-and-labels text -> (name, labels) for lines the fast path parsed. An engine's series keep
# their label sets from one scrape to the next, so after the first scrape a sample line costs a
# dict lookup and a float(); bounded in entries and in key characters so label churn cannot grow it.
# Once full it takes nothing more; a parse that met more new lines than half of what it holds starts
# the next one afresh (the label sets moved on). Clearing in the middle of a page would only churn
# memory on a page it cannot hold anyway, and a page a little larger than the cache still mostly hits
# (sixteen pages of 1,000 series each read in turn: half their lines hit; emptied whenever the lines turned
# away over several parses passed half of it, every line missed, 1.3x and 1.5x the CPU at 12 and 16 pages).
# A page read by its layout never looks its lines up: they leave it when the layout is remembered
# (_remember_layout), so the cache holds the pages still read line by line (64 vLLM targets read ~8,500 series
# into its 8,192 entries: three pages' lines were turned away at every scrape, never enough in one parse to
# empty it, and were never laid out). A line on several pages leaves with the first laid out: the next misses it
# once, and is laid out a read later.
# Only lines without an over-long label value are kept: an entry reads the same with and without Bounds.
_SERIES: dict[str, tuple[str, dict[str, str]]] = {}
_SERIES_MAX = 8192  # vLLM reads 67 samples per (model, rank): a page of 100 series fits
_SERIES_CHARS_MAX = 1024 * 1024
_series_chars = 0
_series_turned_away = 0  # new lines the cache had no room for, since the last parse began


def _may_be_remembered(end: int) -> bool:
    """Whether a line whose labels end at `end` (its `"}`) may be one _SERIES holds: a key over what it may hold in
    all is never in it, and is not copied out of its line to be looked for (a 4 MB label value: 4 MB more)."""
    return end != -1 and end + 2 <= _SERIES_CHARS_MAX


def _remember(line: str, end: int, name: str, labels: dict[str, str]) -> None:
    """Remember the series of a line whose labels end at `end` (its `"}`): its key, the line up to there, is
    copied out only where the cache has room for it."""
    global _series_chars, _series_turned_away
    if len(_SERIES) >= _SERIES_MAX or _series_chars + end + 2 > _SERIES_CHARS_MAX:
        _series_turned_away += 1
        return
    _SERIES[line[: end + 2]] = (name, dict(labels))
    _series_chars += end + 2


def _fresh_series_cache() -> None:
    """At the start of a parse: empty the cache if the last one met many lines it had no room for."""
    global _series_chars, _series_turned_away
    if _series_turned_away > len(_SERIES) // 2:
        _SERIES.clear()
        _series_chars = 0
    _series_turned_away = 0


def _let_go(keys: tuple[str, ...]) -> None:
    """The series of a page now read by its layout leave the cache: the layout holds their labels, and the room
    is for the lines of pages still read line by line (a line without labels, or whose key ran past a `"}` in a
    value, was never in it)."""
    global _series_chars
    for key in keys:
        if _SERIES.pop(key, None) is not None:
            _series_chars -= len(key)


def _cut(labels: dict[str, str], tally: list[int] | None) -> bool:
    """True when a label value is over MAX_LABEL_VALUE_CHARS; with `tally`, cut each such value and count it."""
    long = False
    for key, value in labels.items():
        if len(value) > MAX_LABEL_VALUE_CHARS:
            long = True
            if tally is None:
                break
            labels[key] = value[:MAX_LABEL_VALUE_CHARS] + TRUNCATED_MARK  # same keys: safe while iterating
            tally[0] += 1
    return long


def _lines(text: str) -> Iterator[str]:
    """The lines of `text`, split one block at a time (see _BLOCK_CHARS)."""
    start, n = 0, len(text)
    while start < n:
        end = text.find("\n", start + _BLOCK_CHARS)
        if end == -1:
            end = n
        yield from text[start:end].split("\n")
        start = end + 1


def _unescape(s: str) -> str:
    return _ESCAPE_RE.sub(lambda m: _UNESCAPE[m.group(0)], s)


def _value(s: str) -> float:
    """Float value of one token; '_' is refused as prometheus_client refuses it."""
    if "_" in s:
        raise ValueError(s)
    return float(s)


def _labels_slow(line: str, start: int) -> tuple[dict[str, str], int]:
    """Labels from line[start] == '{' with escapes/spaces; returns (labels, index after '}')."""
    labels: dict[str, str] = {}
    pos = start + 1
    n = len(line)
    while True:
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos < n and line[pos] == "}":
            return labels, pos + 1
        m = _LABEL_RE.match(line, pos)
        if m is None:
            raise ValueError("bad labels")
        name, raw, sep = m.group(1, 2, 3)
        if name in labels:
            raise ValueError("duplicate label")
        labels[intern(name)] = _unescape(raw) if "\\" in raw else raw
        pos = m.end()
        if sep == "}":
            return labels, pos


def _plain_labels(line: str, start: int, stop: int) -> dict[str, str] | None:
    """The labels of line[start:stop] (after its `{`, up to the quote before its `}`) where they are plain: no
    escape, blank or brace, each `name="value"` and every quote a delimiter; None otherwise (the slow path decides).

    Read in place, each value copied once: the span split in pairs and each pair partitioned held a 4 MB label
    value three times over at once, and the agent's RSS on its page touched 96-102 MB for a moment
    (tests/collectors/test_bounds.py's RSS test, its polls every 50 ms catching it now and then)."""
    if line.find("\\", start, stop) != -1 or line.find(" ", start, stop) != -1 or line.find("}", start, stop) != -1:
        return None
    labels: dict[str, str] = {}
    pos = start
    while True:
        sep = line.find('",', pos, stop)
        end = stop if sep == -1 else sep  # this pair: line[pos:end]
        eq = line.find('="', pos, end)
        if eq == -1:
            return None
        key = line[pos:eq]
        if key in labels or '"' in key or "=" in key:
            return None
        labels[intern(key)] = line[eq + 2 : end - 1 if end > eq + 2 and line[end - 1] == '"' else end]
        if sep == -1:
            break
        pos = sep + 2
    # Every quote a delimiter, two a pair: else the '"}' found was an opening quote (a value starting with `}`)
    return labels if line.count('"', start, stop) == 2 * len(labels) else None


def _parse_sample(line: str, brace: int, tally: list[int] | None = None) -> Sample:
    """One sample line (stripped, not a comment); `brace` = line.find("{"). ValueError if malformed.

    With `tally` (under Bounds), over-long label values are cut and counted in tally[0]."""
    end = line.find('"}', brace) if brace != -1 else -1
    if _may_be_remembered(end):  # a line starting as a remembered one has its name first, then its labels
        hit = _SERIES.get(line[: end + 2])
        if hit is not None:
            return _finish(hit[0], dict(hit[1]), line[end + 2 :])
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space or not line[space:brace].strip()):
        name = line[:brace].rstrip()
        plain = _plain_labels(line, brace + 1, end + 1) if end != -1 else None
        if plain is None:
            labels, after = _labels_slow(line, brace)
            rest = line[after:]
        else:
            labels, rest = plain, line[end + 2 :]
            if name and _NAME_RE.match(name):
                # Remembered only where the name runs up to its `{`: a hit then tells the name as a filter would
                # read it from the line (select() checks a hit's name alone; `name\x0b{` is another name there).
                if not _cut(labels, tally) and brace == len(name):
                    _remember(line, end, name, labels)
                return _finish(name, labels, rest)
        if not name:
            name = labels.pop("__name__", "")
        _cut(labels, tally)
    else:
        tab = line.find("\t")
        if tab != -1 and (space == -1 or tab < space):  # `name<TAB>value 123`: the tab ends the name
            space = tab
        if space == -1:
            raise ValueError("no value")
        name = line[:space]
        labels = {}
        rest = line[space:]
    if not _NAME_RE.match(name):
        raise ValueError("bad name")
    return _finish(name, labels, rest)


def _finish(name: str, labels: dict[str, str], rest: str) -> Sample:
    """The value (and optional timestamp) after the name and labels."""
    if "#" not in rest and "_" not in rest:
        try:  # the common line: one value, which float() reads with the whitespace around it
            return _new_sample(Sample, (name, labels, float(rest), None))
        except ValueError:
            pass  # a timestamp after the value, or no value: read below
    hash_at = rest.find("#")
    if hash_at != -1:  # exemplar (OpenMetrics style) after the value: drop it
        rest = rest[:hash_at]
    parts = rest.split()
    if not parts or len(parts) > 2:
        raise ValueError("bad value")
    ts = _value(parts[1]) / 1000 if len(parts) == 2 else None
    return _new_sample(Sample, (name, labels, _value(parts[0]), ts))


class _Reading:
    """What one parse() or select() call creates under its Bounds (if any): the room left, the samples
    and labels made, the wanted lines dropped past the caps or unreadable; close() adds them to the Bounds."""

    __slots__ = ("limits", "room", "label_room", "full", "tally", "created", "used", "dropped", "bad")

    def __init__(self, limits: Bounds | None) -> None:
        self.limits = limits
        self.room = self.label_room = -1  # samples and labels this call may still create; -1: no limit
        if limits is not None and limits.max_samples is not None:
            self.room = max(0, limits.max_samples - limits.samples)
        if limits is not None and limits.max_labels is not None:
            self.label_room = max(0, limits.max_labels - limits.labels)
        self.full = self.room == 0 or self.label_room == 0
        self.tally = [0] if limits is not None and limits.truncate_labels else None
        self.created = self.used = self.dropped = self.bad = 0

    def read(self, line: str, brace: int) -> Sample | None:
        """The sample on a wanted line (stripped; `brace` = line.find("{")); None for one past the caps
        (counted in `dropped`, not read) or one that does not parse (counted in `bad`)."""
        if self.full:
            self.dropped += 1
            return None
        try:
            return _parse_sample(line, brace, self.tally)
        except (ValueError, IndexError):
            self.bad += 1
            return None

    def count(self, sample: Sample) -> None:
        """A sample kept: against the caps."""
        if self.limits is not None:
            self.created += 1
            self.used += len(sample.labels)
            self.full = self.created == self.room or (self.label_room != -1 and self.used >= self.label_room)

    def close(self) -> int:
        """Add what this call made and cut to its Bounds; the label values cut."""
        truncated = self.tally[0] if self.tally is not None else 0
        limits = self.limits
        if limits is not None:
            limits.samples += self.created
            limits.labels += self.used
            limits.samples_dropped += self.dropped
            limits.labels_truncated += truncated
        return truncated


@functools.lru_cache(maxsize=64)
def _family_names(keep: frozenset[str]) -> frozenset[str]:
    """The HELP/TYPE names that can own the kept sample names (an adapter passes the same set each time)."""
    return keep | {n[: -len(s)] for n in keep for s in _SUFFIXES if n.endswith(s)}


@functools.lru_cache(maxsize=1024)
def _allowed_names(family: str, typ: str) -> tuple[str, ...]:
    """The sample names a family of this type groups, as prometheus_client groups them (once per family,
    not once per page)."""
    return tuple(family + s for s in _ALLOWED_SUFFIXES.get(typ, ("",)))


# The sample names a family's lines can carry, by its type (and the bare name of an untyped one).
_FAMILY_SUFFIXES = ("", "_bucket", "_count", "_sum", "_total", "_created", "_info")


@functools.lru_cache(maxsize=1024)
def _unread_heads(family: str, keep: frozenset[str]) -> tuple[str, ...]:
    """Line starts that mark a sample of `family` whose name is not in `keep` (`name{` and `name `), or
    the family's own HELP or TYPE line, when `family` is not read.

    While no family is open such a line changes nothing (a sample would close the family, already
    closed; the comment would skip the family again), so parse() skips it with one startswith instead of
    reading it: most lines of a page are of families an adapter does not read (vLLM's: 480 of 630).
    Empty for a name that is not a valid metric name (a `{` in it would make the line's name shorter
    than the family's)."""
    if not _NAME_RE.match(family):
        return ()
    samples = (name + end for suffix in _FAMILY_SUFFIXES if (name := family + suffix) not in keep
               for end in ("{", " "))
    return (*samples, f"# HELP {family} ", f"# TYPE {family} ")


def _head(line: str, brace: int) -> str:
    """The metric name at the start of a sample line, cheaply ('' for a `{__name__=...}` line)."""
    head = line[:brace] if brace != -1 else line
    if " " in head or "\t" in head:
        head = head.split(None, 1)[0] if head.strip() else ""
    return head


def _kept(name: str, want: tuple[str, ...] | None, keep: Collection[str] | None) -> bool:
    """Whether a filter of name prefixes `want` and names `keep` (None: any) keeps a sample name read from
    its line: a `{__name__=...}` line's name is known only after the line is read."""
    return (want is None or name.startswith(want)) and (keep is None or name in keep)


def _sample_name(line: str, brace: int, keep: Collection[str]) -> str:
    """The name a sample line (stripped, not a `{__name__=...}` one; `brace` = line.find("{")) is filtered
    by: up to its `{` or first space, else, where that is not one of `keep`, up to its first whitespace."""
    head = line[:brace] if brace != -1 else line.partition(" ")[0]
    if head not in keep and (" " in head or "\t" in head):
        head = _head(line, brace)
    return head


def _meta_name(line: str) -> str | None:
    """The metric name of a HELP/TYPE comment spelled with odd spacing, or None for other comments."""
    parts = line.split(None, 3)
    return parts[2] if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") else None


def parse(
    text: str,
    *,
    prefixes: Iterable[str] | None = None,
    names: Collection[str] | None = None,
    bounds: Bounds | None = None,
) -> Exposition:
    """Parse a text exposition in one pass.

    Filters (both optional, both applied before any label parsing, the main saving for an adapter
    that reads a dozen families out of a page of hundreds):
    - `prefixes`: keep only metric names starting with one of these (e.g. ("vllm:",));
    - `names`: keep only these exact wire sample names (e.g. "vllm:num_requests_running",
      "vllm:time_to_first_token_seconds_bucket"). HELP/TYPE lines are read for the families
      those names belong to, so `Family.type` stays right.
    Raises ParseError only when at least one line was bad and no sample parsed.

    `bounds` (default: those set with `bounded()`, else none) limits the samples created and the
    length of label values, and receives the counts of what was cut.
    """
    exp = _read(text, prefixes=prefixes, names=names, bounds=bounds)
    if exp.bad_lines and not exp.by_name:
        raise ParseError(f"no sample parsed ({exp.bad_lines} bad lines)")
    return exp


def _read(
    text: str,
    *,
    prefixes: Iterable[str] | None,
    names: Collection[str] | None,
    bounds: Bounds | None,
) -> Exposition:
    """parse() without its ParseError: select() reads odd pages with it."""
    _fresh_series_cache()
    limits = bounds if bounds is not None else _BOUNDS.get()
    reading = _Reading(limits)
    loose: Family | None = None  # the untyped family of the previous sample, under Bounds
    want: tuple[str, ...] | None = tuple(prefixes) if prefixes is not None else None
    keep: frozenset[str] | None = frozenset(names) if names is not None else None
    keep_meta = _family_names(keep) if keep is not None else None
    filtered = want is not None or keep is not None
    meta_heads = ("# HELP ", "# TYPE ")
    families: list[Family] = []
    by_name: dict[str, list[Sample]] = {}
    bad = 0  # comment lines that do not parse; reading counts the sample lines
    fam: Family | None = None
    allowed: tuple[str, ...] = ()

    skip: tuple[str, ...] = ()  # sample lines of the skipped family just met (see _unread_heads)
    for line in text.split("\n") if len(text) <= _BLOCK_CHARS else _lines(text):
        if skip and fam is None and loose is None and line.startswith(skip):
            continue
        line = line.strip()
        if not line:
            continue
        if line[0] == "#":
            loose = None
            if filtered:
                if line.startswith(meta_heads):
                    end = line.find(" ", 7)
                    mname = line[7:end] if end != -1 else line[7:]
                else:
                    mname = _meta_name(line)
                    if mname is None:
                        continue
                if (want is not None and not mname.startswith(want)) or (
                    keep_meta is not None and mname not in keep_meta
                ):
                    fam, allowed = None, ()  # a skipped family closes the current one
                    skip = _unread_heads(mname, keep) if keep is not None else ()
                    continue
            parts = line.split(None, 3)
            if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
                continue
            kind, mname = parts[1], parts[2]
            if not _NAME_RE.match(mname):
                bad += 1
                fam, allowed = None, ()
                continue
            if kind == "HELP":
                doc = parts[3] if len(parts) == 4 else ""
                if "\\" in doc:
                    doc = _HELP_ESCAPE_RE.sub(lambda m: _UNESCAPE[m.group(0)], doc)
                if fam is None or fam.name != mname:
                    fam = Family(mname, "unknown", doc)
                    families.append(fam)
                    allowed = (mname,)
                else:
                    fam.help = doc
            else:
                if len(parts) < 4:
                    bad += 1
                    continue
                typ = parts[3] if parts[3] != "untyped" else "unknown"  # as prometheus_client
                if fam is None or fam.name != mname:
                    fam = Family(mname, typ, "")
                    families.append(fam)
                else:
                    fam.type = typ
                allowed = _allowed_names(mname, typ)
            continue
        brace = line.find("{")
        if filtered and line[0] != "{":
            if want is not None and not line.startswith(want):
                fam, allowed = None, ()  # prometheus_client would close the family here
                continue
            if keep is not None:
                head = _sample_name(line, brace, keep)
                if head not in keep:
                    if head not in allowed:  # prometheus_client would close the family
                        fam, allowed = None, ()
                    continue
        sample = reading.read(line, brace)
        if sample is None:
            continue
        name = sample.name
        if line[0] == "{" and not _kept(name, want, keep):
            continue  # a `{__name__="..."}` line: its name is known only now
        reading.count(sample)
        if name in allowed and fam is not None:
            fam.samples.append(sample)
        elif loose is not None and loose.name == name:
            loose.samples.append(sample)  # under Bounds: a run of untyped samples of one name, one Family
        else:
            family = Family(name, "unknown", "", [sample])
            families.append(family)
            fam, allowed = None, ()
            loose = family if limits is not None else None
        lst = by_name.get(name)
        if lst is None:
            by_name[name] = [sample]
        else:
            lst.append(sample)

    truncated = reading.close()
    # Families opened by HELP/TYPE that never got a sample are kept (prometheus_client keeps them).
    return Exposition(families, by_name, bad + reading.bad, reading.dropped, truncated)


def select(
    text: str,
    names: Collection[str],
    *,
    prefixes: Iterable[str] | None = None,
    bounds: Bounds | None = None,
) -> Selection:
    """The samples of `names` (those of them starting with one of `prefixes`, when given) by wire name in
    page order: exactly parse(text, prefixes=prefixes, names=names, bounds=bounds).by_name, with the same
    counts into the Bounds, without a Python step for any line of another family.

    Why (measured, `python bench/bench_sampling.py`): an adapter reads ~120 of the 630 lines of a vLLM
    page, and parse() still takes every line through its loop to keep prometheus_client's grouping,
    which no adapter reads; one regular expression (_finders) finds the wanted lines in C instead: on
    that page 56 us against parse()'s ~300 us of stepping through lines. The pattern also finds every
    line that starts with anything but a name's first character, `#` or nothing (leading whitespace, a
    `{__name__=...}` line), which is then read through the same checks as parse() reads it.

    A page whose found lines are all series read before, in the order of a page read before, is read in C
    (_as_before): select() on that page 150 us against 213 warm, 365-487 against 556-637 us after 100 ms
    asleep (thread CPU time, median of 55 pages, interleaved).
    """
    want = tuple(prefixes) if prefixes is not None else None
    keep = frozenset(names)
    finders = _finders(keep, want)
    if finders is None:  # no name a line could start with: only a `{__name__=...}` line could hold one
        exp = _read(text, prefixes=want, names=keep, bounds=bounds)
        return Selection(exp.by_name, exp.bad_lines)
    small = len(text) <= _LAYOUT_MAX_CHARS  # a layout's page: its lines found split in key and rest
    first, after_newline = finders[:2] if small else finders[2:]
    _fresh_series_cache()
    reading = _Reading(bounds if bounds is not None else _BOUNDS.get())
    blocks = _found(first, after_newline, text)
    head: list[tuple[str, str, str]] = []
    if small:  # a block of lines at a time, a list each (a generator step per line: vllm.parse 228-267 us, now 212-232)
        for block in blocks:
            head += block
            if len(head) > _LAYOUT_MAX_LINES:
                break
    found = itertools.chain.from_iterable(blocks)  # what the head did not take
    known = 0 < len(head) <= _LAYOUT_MAX_LINES  # the page's found lines are all in `head`
    if known and (same := _as_before(head, reading)) is not None:
        return same
    by_name: dict[str, list[Sample]] = {}
    # The counts _Reading.count keeps, kept here as locals: a method call per sample is not free.
    series, counted = _SERIES, reading.limits is not None
    room, label_room, created, used = reading.room, reading.label_room, 0, 0
    seen_lines: list[tuple[str, dict[str, str]]] | None = [] if known else None  # while every line is a known series
    for key, rest, odd in itertools.chain(head, found):
        if key and small:  # a line starting with a wanted name: `key` is its name and labels (_LINE), `rest` the rest
            seen = series.get(key) if not reading.full else None
            line = ""
        elif key:  # ... on a larger page, `key` is the whole line (_WHOLE_LINE): never copied to be read
            line, end, seen = key, key.find('"}'), None
            if _may_be_remembered(end) and not reading.full:
                seen = series.get(line[: end + 2])
                rest = line[end + 2 :]
        else:  # a line no name starts: blank, indented or `{__name__=...}`; what parse() would keep of it
            seen_lines = None
            line = odd.strip()
            if not line or line[0] == "#" or (line[0] != "{" and want is not None and not line.startswith(want)):
                continue
            end, seen = line.find('"}'), None
            if _may_be_remembered(end) and not reading.full:
                seen = series.get(line[: end + 2])
                rest = line[end + 2 :]
        if seen is not None:  # a series read before (most lines): its name and labels, as _parse_sample finds them
            name = seen[0]
            if name not in keep:
                seen_lines = None
                continue
            try:
                sample = _finish(name, dict(seen[1]), rest)
            except ValueError:
                reading.bad += 1
                seen_lines = None
                continue
            if seen_lines is not None:
                seen_lines.append(seen)
        else:
            line = (line or key + rest).rstrip()
            brace = line.find("{")
            if line[0] != "{" and _sample_name(line, brace, keep) not in keep:
                seen_lines = None
                continue  # the line starts with a wanted name, followed by more of another name
            sample = reading.read(line, brace)
            if sample is None:
                seen_lines = None
                continue
            if line[0] == "{" and not _kept(sample.name, want, keep):
                seen_lines = None
                continue  # a `{__name__="..."}` line: its name is known only now
            if seen_lines is not None:  # a line without labels, `name value`, is known by its name and blank
                if key[-1:] in _BLANKS and sample.name == key[:-1] and not sample.labels:
                    seen_lines.append((sample.name, _NO_LABELS))
                else:
                    seen_lines = None
        if counted:
            created += 1
            used += len(sample.labels)
            reading.full = created == room or (label_room != -1 and used >= label_room)
        same_name = by_name.get(sample.name)
        if same_name is None:
            by_name[sample.name] = [sample]
        else:
            same_name.append(sample)
    reading.created, reading.used = created, used
    reading.close()
    if seen_lines and not (reading.dropped or reading.bad):
        _remember_layout(tuple(key for key, _, _ in head), seen_lines)
    return Selection(by_name, reading.bad)


def _found(first: re.Pattern[str], after_newline: re.Pattern[str], text: str) -> Iterator[list[tuple[str, str, str]]]:
    """select()'s lines, as findall's (key, rest, odd line) triples: a tuple each, where finditer made a Match
    object each and a call to read it. A block of _SELECT_BLOCK_CHARS at a time, cut at newlines: a page of a
    million blank lines starting with a space is a million triples, never all at once."""
    head = first.match(text)
    if head is not None:
        yield [head.groups()]  # type: ignore[list-item]
    start, n = 0, len(text)
    while start < n:
        end = text.find("\n", start + _SELECT_BLOCK_CHARS)
        if end == -1:
            end = n
        yield after_newline.findall(text, start, end)  # each match starts at a newline: none is cut
        start = end


class _Layout(NamedTuple):
    """The names and labels of a page's found lines, each a series read before (select's _as_before)."""

    labels: tuple[dict[str, str], ...]  # _SERIES' own dicts (or _NO_LABELS), never handed out: each sample gets a copy
    runs: dict[str, tuple[tuple[int, int], ...]]  # each name's lines, in page order: (first, end) of each run of them
    label_count: int
    plans: dict[Hashable, object]  # planned()'s plans on this layout, by their key


# A page's found lines' keys -> their _Layout. An engine's page keeps its series from one scrape to the next,
# so after two pages the third is read by _as_before: its values in C (map(float, ...)) and its samples made
# in C, where the loop took a Python step per line (measured: see select()). Bounded in the bytes the layouts
# hold, estimated as their keys' characters twice (the key's str, its labels' strs), _LAYOUT_LINE_BYTES a line (the
# key's slots, its run, a labels dict once the series cache let it go) and _LAYOUT_LABEL_BYTES a label (its dict
# entry, its strs' headers). Measured with tracemalloc (the test test_the_layouts_held_take_no_more_memory_than_
# they_are_counted_as), a line held ~270 bytes + 61 a label + 2 a character: counted as the keys' characters once
# and 600 a line, a line of 20 labels held 1.7x, of 30 2.2x. A vLLM page's layout ~130 kB, ~170 kB with its plans,
# 64 targets' ~10.7 MB. When a new one would not fit, every one is forgotten and the pages read now are
# remembered afresh (at 64 targets with 8 MiB, each page's layout was forgotten before it was read a third time).
_LAYOUTS: dict[tuple[str, ...], _Layout] = {}
_LAYOUT_BYTES_MAX = 16 * 1024 * 1024
_LAYOUT_LINE_BYTES = 600
_LAYOUT_LABEL_BYTES = 64
# A page larger, or finding more lines, is read line by line, a block at a time: a layout's page has its found
# lines all held at once, at most ~1 MB (a 4 MiB page of lines of sixty labels held whole took the agent past 100 MB).
_LAYOUT_MAX_CHARS = 512 * 1024
_LAYOUT_MAX_LINES = 4096
_layout_bytes = 0


def _as_before(head: list[tuple[str, str, str]], reading: _Reading) -> Selection | None:
    """select()'s Selection of a page whose found lines have the keys of a remembered layout, every value a
    plain number and the Bounds' room enough for all of them; None otherwise (the page is read line by line)."""
    if not head:
        return None
    keys, rests, _ = zip(*head)
    layout = _LAYOUTS.get(keys)  # an odd line's key is "": never in a layout
    if layout is None:
        return None
    n = len(keys)
    if reading.room != -1 and n >= reading.room:
        return None
    if reading.label_room != -1 and layout.label_count >= reading.label_room:
        return None
    joined = "".join(rests)
    if "_" in joined or "#" in joined:  # `_` is refused, `#` starts an exemplar: _finish decides, line by line
        return None
    try:
        values = list(map(float, rests))
    except ValueError:  # a timestamp after a value, or no value: read line by line
        return None
    if reading.limits is not None:  # counted as made: each is, when first asked for (Selection.get)
        reading.created, reading.used = n, layout.label_count
    reading.close()
    return Selection({}, 0, layout, values)


def _laid_out(layout: _Layout, values: list[float], name: str) -> list[Sample]:
    """The samples of one name on a layout's page, each with its own copy of its labels (made in C, a run at a time)."""
    out: list[Sample] = []
    for first, end in layout.runs[name]:
        n = end - first
        out += map(_new_sample, itertools.repeat(Sample, n),
                   zip(itertools.repeat(name, n), map(dict, layout.labels[first:end]), values[first:end],
                       itertools.repeat(None, n)))
    return out


def _remember_layout(keys: tuple[str, ...], seen: list[tuple[str, dict[str, str]]]) -> None:
    """Remember the layout of a page whose every found line was a series read before (a cache hit)."""
    global _layout_bytes
    if keys in _LAYOUTS:
        return
    runs: dict[str, list[tuple[int, int]]] = {}  # by name in order of first appearance, as by_name has them
    for i, (name, _) in enumerate(seen):
        spans = runs.setdefault(name, [])
        if spans and spans[-1][1] == i:
            spans[-1] = (spans[-1][0], i + 1)
        else:
            spans.append((i, i + 1))  # a name's lines in another place (a histogram per rank on a DP page)
    cost = layout_bytes(keys)
    if not _room_for(cost) and cost > _LAYOUT_BYTES_MAX:
        return
    layout = _Layout(tuple(labels for _, labels in seen), {name: tuple(spans) for name, spans in runs.items()},
                     sum(len(labels) for _, labels in seen), {})
    if _LAYOUTS.setdefault(keys, layout) is layout:  # counted once, were another thread to remember the same keys
        _layout_bytes += cost
        _let_go(keys)


def _room_for(cost: int) -> bool:
    """Whether `cost` more bytes fit in what the layouts and their plans may hold (_LAYOUT_BYTES_MAX); where they do
    not, every layout is forgotten, and the pages read from now on are remembered afresh."""
    global _layout_bytes
    if _layout_bytes + cost <= _LAYOUT_BYTES_MAX:
        return True
    _LAYOUTS.clear()
    _layout_bytes = 0
    return False


def layout_bytes(keys: tuple[str, ...]) -> int:
    """What a layout of these keys is counted as holding (_LAYOUT_BYTES_MAX)."""
    labels = sum(key.count('="') for key in keys)  # a `="` in a value counts one more: over, never under
    return 2 * sum(map(len, keys)) + _LAYOUT_LINE_BYTES * len(keys) + _LAYOUT_LABEL_BYTES * labels


# select() reads a page this many characters at a time (_found): at most ~8k lines' pairs (~0.6 MB) at once.
_SELECT_BLOCK_CHARS = 16 * 1024

# A line starting with one of the names where the name ends: its key (group 1: the name, and where a `{` follows
# it, its labels up to the line's last `"}`, else the space or tab after it) and the rest (group 2); or a line
# whose first character cannot start a name, a comment or an empty line (group 3: leading whitespace,
# `{__name__=...}`). _SERIES keeps a line's name and labels up to its first `"}`: where the two differ (a `"}` in
# a value, or in an exemplar after it), the key is no series read before, and the line is read as a new one (the
# same samples). The greedy scan back from the line's end costs findall 81 us on the vLLM page against 63 for the
# whole line, where a lazy one forward took 142 (timeit, warm).
_LINE = r'(?:({names}(?![A-Za-z0-9_:])(?:\{[^\n]*"\}|[ \t])?)([^\n]*)|([^A-Za-z_:#\n][^\n]*))'
# The same lines found whole (group 1; group 2 empty), on a page over _LAYOUT_MAX_CHARS, read line by line: a line
# split in key and rest is copied whole again to be read where it is no series read before, and a page of one
# label value of 4 MB held one copy more (tracemalloc peak 25.2 MB against 21.0).
_WHOLE_LINE = r"(?:({names}(?![A-Za-z0-9_:])[^\n]*)()|([^A-Za-z_:#\n][^\n]*))"
_BLANKS = (" ", "\t")  # what ends the key of a line without labels
_NO_LABELS: dict[str, str] = {}  # a layout's labels of such a line (never handed out: each sample gets a copy)


@functools.lru_cache(maxsize=64)
def _finders(keep: frozenset[str], want: tuple[str, ...] | None) -> tuple[re.Pattern[str], ...] | None:
    """select()'s patterns for the kept names that start with `want` (an adapter passes the same ones on
    every page): the first line's, and every other line's, after its newline (a literal start lets the
    regex engine jump from newline to newline), each splitting a line in key and rest (_LINE), then the same
    two finding it whole (_WHOLE_LINE); None when no name could start a sample line."""
    usable = sorted(n for n in keep if n and (want is None or n.startswith(want)) and "{" not in n and "\n" not in n)
    if not usable:
        return None
    names = _trie(usable)
    split, whole = _LINE.replace("{names}", names), _WHOLE_LINE.replace("{names}", names)
    return re.compile(split), re.compile("\n" + split), re.compile(whole), re.compile("\n" + whole)


def _trie(words: list[str]) -> str:
    """A pattern matching exactly `words`, factored by their common prefixes: the regex engine tries an
    alternation's branches in turn, so 60 flat names would cost a failed compare each on every line."""
    root: dict[str, dict] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}  # a word ends here
    return _branches(root)


def _branches(node: dict[str, dict]) -> str:
    arms = []
    for ch in sorted(k for k in node if k):
        chain, child = re.escape(ch), node[ch]
        while len(child) == 1 and "" not in child:  # a run without a fork is one literal
            ((ch, child),) = child.items()
            chain += re.escape(ch)
        arms.append(chain + _branches(child))
    if not arms:
        return ""
    body = arms[0] if len(arms) == 1 else "(?:" + "|".join(arms) + ")"
    return f"(?:{body})?" if "" in node else body


def histograms(
    exp: Exposition | Selection, base: str, key: Callable[[Mapping[str, str]], K]
) -> dict[K, Histogram]:
    """Assemble `<base>_bucket/_count/_sum` into Histograms, grouped by `key(labels)`.

    `key` receives each sample's labels (with `le` still present on buckets; it must ignore it), and gives what
    they alone decide (see _key_identity).
    Samples with the same key and the same `le` are summed (e.g. one series per process in
    prometheus multiprocess mode, distinguished only by a label the key drops). A group whose
    values are not all finite and non-negative, or that has no buckets, is left out; so is one with
    more than MAX_HISTOGRAM_BUCKETS buckets, counted (drop_value) as HISTOGRAM_TOO_MANY_BUCKETS.

    On a page read as one read before (Selection.layout), where each bucket, count and sum is one sample, the
    grouping and order are planned once per layout (_plan) and each page only reads its values (_planned).
    """
    plan = histogram_plan(exp, base, key) if isinstance(exp, Selection) else None
    if plan is not None:
        return _planned(exp.values, plan)  # type: ignore[arg-type]
    buckets: dict[K, dict[float, float]] = {}
    counts: dict[K, float] = {}
    sums: dict[K, float] = {}
    for s in exp.get(base + "_bucket"):
        labels = s.labels
        bound = _bound(labels.get("le"))
        if bound is None:
            continue
        k = key(labels)
        group = buckets.get(k)
        if group is None:
            group = buckets[k] = {}
        group[bound] = group.get(bound, 0.0) + s.value
    for suffix, into in (("_count", counts), ("_sum", sums)):
        for s in exp.get(base + suffix):
            k = key(s.labels)
            into[k] = into.get(k, 0.0) + s.value
    out: dict[K, Histogram] = {}
    for k, group in buckets.items():
        if len(group) > MAX_HISTOGRAM_BUCKETS:
            drop_value(HISTOGRAM_TOO_MANY_BUCKETS)
            continue
        pairs = sorted(group.items())
        count = counts.get(k, pairs[-1][1] if pairs[-1][0] == INF else None)
        total = sums.get(k)
        if count is not None and total is not None and (hist := _histogram(pairs, count, total)) is not None:
            out[k] = hist
    return out


def histogram_plan(exp: Selection, base: str, key: Callable[[Mapping[str, str]], K]) -> HistogramPlan | None:
    """histograms()' plan of `base` on this page's layout (planned()); None on a page read line by line, for a key
    function that cannot be planned, or where the page's histograms are read anew each time (_plan)."""
    ident = _key_identity(key) if exp.layout is not None else None
    if ident is None:
        return None
    return planned(exp, (base, ident), lambda: _plan(exp, base, key))


def planned_histograms(values: list[float], plan: HistogramPlan) -> dict[Hashable, Histogram]:
    """histograms() of a page of the plan's layout whose every value (Selection.values) the caller found finite and
    non-negative: none is refused for its values then, and none is checked again (the same Histograms:
    tests/collectors/test_vllm_planned.py)."""
    return _planned(values, plan, False)


def _histogram(pairs: list[tuple[float, float]], count: float, total: float) -> Histogram | None:
    """The Histogram of sorted (bound, count) pairs, ended by +Inf at `count` where they stop short; None unless
    every count is finite and non-negative and the sum a number (histograms() and a checked _planned alike)."""
    if pairs[-1][0] != INF:
        pairs.append((INF, count))
    values = [v for _, v in pairs]
    values.append(count)
    # every count in [0, inf), NaN refused: three passes in C where a generator took a Python step per bucket
    if not (min(values) >= 0.0 and max(values) < INF) or any(map(math.isnan, values)) or not math.isfinite(total):
        return None
    return Histogram(buckets=tuple(pairs), count=count, sum=total)


class _Group(NamedTuple):
    """One histogram of a planned page: its key, sorted bounds, the line (Selection.values' index) of each bound's
    bucket sample, and of its count and sum samples (None: absent)."""

    key: Hashable
    bounds: tuple[float, ...]
    at: tuple[int, ...]
    count_at: int | None
    sum_at: int | None


HistogramPlan = tuple[_Group, ...]
_UNPLANNED = object()
_PLANS_PER_LAYOUT = 64  # a caller making a new key function per call leaves no more plans than this

P = TypeVar("P")


def planned(exp: Selection, key: Hashable, make: Callable[[], P]) -> P | None:
    """The plan under `key` on this page's layout, made by `make` on the first page of the layout; None on a
    page read line by line. A plan reads only names and labels (a layout's pages share them) and gives lines to
    read in `exp.values`: each page of the layout then reads its values by line, no Sample made.

    Why (measured: vllm.parse of the vLLM page with moving values, best of 9 x 1,000, five processes each,
    interleaved, pinned to one core): 267-315 us with its Samples made, 216-268 with its tables planned."""
    layout = exp.layout
    if layout is None:
        return None
    plan = layout.plans.get(key, _UNPLANNED)
    if plan is _UNPLANNED:
        plan = make()
        if len(layout.plans) < _PLANS_PER_LAYOUT:
            layout.plans[key] = plan
            _count_plan(plan)
    return plan  # type: ignore[return-value]


def _count_plan(plan: object) -> None:
    """Count a plan kept into the layouts' bytes (_room_for; where it does not fit, its layout is forgotten with
    the others): a page of a thousand one-bucket histograms planned 44% over what its layout was counted as,
    where the vLLM page's plans add 9%."""
    global _layout_bytes
    cost = _plan_bytes(plan)
    if _room_for(cost):
        _layout_bytes += cost


def _plan_bytes(plan: object) -> int:
    """What a plan is counted as holding: _PLAN_ITEM_BYTES an item of its tuples, nested ones included, and the
    characters of each string in them (one the plan made, e.g. a setting normalized: vllm._page_plan; the item's
    bytes count its string's header)."""
    if isinstance(plan, str):
        return len(plan)
    if not isinstance(plan, tuple):
        return 0
    return _PLAN_ITEM_BYTES * len(plan) + sum(_plan_bytes(item) for item in plan)


_PLAN_ITEM_BYTES = 48  # a tuple's slot and its share of the tuple, and the int it holds (held under it: a test)


def _key_identity(key: Callable[[Mapping[str, str]], K]) -> object | None:
    """What a key function is planned under: its code and its module's globals, where nothing else decides what it
    gives (a lambda an adapter writes in its body is a new function on every call, with the same code); None for
    a closure, defaults, a bound method or another callable. A planned key must read no global that changes."""
    if type(key) is not types.FunctionType or key.__closure__ or key.__defaults__ or key.__kwdefaults__:
        return None
    return key.__code__, id(key.__globals__)


def _plan(exp: Selection, base: str, key: Callable[[Mapping[str, str]], K]) -> HistogramPlan | None:
    """histograms()' grouping of a page, as lines (Selection.values' indices): None where a bucket, count or sum is
    repeated (the generic reading sums them), a bound is NaN, or a histogram has too many buckets (it is counted)."""
    groups: dict[K, dict[float, int]] = {}
    for i, s in zip(exp.lines(base + "_bucket"), exp.get(base + "_bucket")):
        bound = _bound(s.labels.get("le"))
        if bound is None:
            continue
        group = groups.setdefault(key(s.labels), {})
        if bound in group or bound != bound:
            return None
        group[bound] = i
    found: list[dict[K, int]] = [{}, {}]
    for suffix, at in zip(("_count", "_sum"), found):
        for i, s in zip(exp.lines(base + suffix), exp.get(base + suffix)):
            if at.setdefault(key(s.labels), i) != i:
                return None
    if any(len(group) > MAX_HISTOGRAM_BUCKETS for group in groups.values()):
        return None
    return tuple(_Group(k, tuple(bounds := sorted(group)), tuple(group[b] for b in bounds), found[0].get(k),
                        found[1].get(k)) for k, group in groups.items())


def _planned(values: list[float], plan: HistogramPlan, checked: bool = True) -> dict[Hashable, Histogram]:
    """histograms() of a page by its plan: the same Histograms, each value read by line (a value plus 0.0, as
    the generic reading sums from 0.0: -0.0 reads as 0.0 either way); `checked` False where the caller found every
    value good (planned_histograms)."""
    out: dict[Hashable, Histogram] = {}
    for group in plan:
        counts = [0.0 + values[i] for i in group.at]
        finite = group.bounds[-1] != INF
        count = 0.0 + values[group.count_at] if group.count_at is not None else (None if finite else counts[-1])
        if count is None or group.sum_at is None:
            continue
        pairs = list(zip(group.bounds, counts))
        if checked:
            hist = _histogram(pairs, count, 0.0 + values[group.sum_at])
            if hist is None:
                continue
        else:
            if finite:
                pairs.append((INF, count))
            hist = Histogram(buckets=tuple(pairs), count=count, sum=0.0 + values[group.sum_at])
        out[group.key] = hist
    return out


# `le` label value -> its bound: a page's histograms share a few dozen bounds, read on every page.
# Not functools.lru_cache: a cache that lives across pages must not keep an engine's over-long `le` values,
# and the length check in front of an lru_cache costs a second call: 110 ns a bucket against this dict's
# 74 ns (lru_cache alone: 72 ns; timeit over vLLM's 20 bounds, min of 5 x 20000 rounds, Python 3.11).
_BOUNDS_READ: dict[str, float] = {}
_BOUNDS_READ_MAX = 4096


def _bound(le: str | None) -> float | None:
    """A bucket's `le` as a number; None for none or one that is not a number."""
    if le is None:
        return None
    bound = _BOUNDS_READ.get(le)
    if bound is None:
        try:
            bound = float(le)
        except ValueError:
            return None
        if len(_BOUNDS_READ) < _BOUNDS_READ_MAX and len(le) <= MAX_LABEL_VALUE_CHARS:
            _BOUNDS_READ[le] = bound
    return bound
