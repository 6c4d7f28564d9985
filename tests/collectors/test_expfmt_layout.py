"""select() reads a page whose found lines are the series of a page it read before (the same keys, in the same
order) without a Python step per line (expfmt._as_before): what it returns, and what it counts into the
Bounds, must still be exactly parse()'s `by_name`, whatever the new values are (NaN, +Inf, `1_0`, a
timestamp after the value, an exemplar, nothing), and the layouts it remembers stay within their bound.
"""

from __future__ import annotations

import multiprocessing
import re
import tracemalloc
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rooflight.collectors import expfmt, vllm
from test_expfmt_select import ADAPTERS, PAGES, _agree, _by_name
from test_fuzz import FUZZ

VLLM_PAGE = (Path(__file__).parents[1] / "fixtures" / "engine-samples" / "vllm-cpu-load-c16.prom").read_text()
_VALUE = re.compile(r"^([^#\s][^\n]*?[}\w]) (\S+)$", re.M)  # a sample line without a timestamp, and its value
T = TypeVar("T")
ODD_VALUES = ("NaN", "+Inf", "-Inf", "1_0", "1e3", "-0.0", "0x1", "", "1 1700000000000", '2 # {a="b"} 1',
              "7 \r", "nan", "1.5e-9", "12345678901234567890")


def _with_values(text: str, values: list[str]) -> str:
    """The page with its sample lines' values replaced in turn by `values` (cycled)."""
    count = iter(range(1 << 30))
    return _VALUE.sub(lambda m: f"{m.group(1)} {values[next(count) % len(values)]}".rstrip(" "), text)


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """No series and no layout known yet (the module's caches as at start; put back after the test)."""
    for name, value in (("_SERIES", {}), ("_series_chars", 0), ("_series_turned_away", 0), ("_LAYOUTS", {}),
                        ("_layout_bytes", 0)):
        monkeypatch.setattr(expfmt, name, value)


# Every test here starts with the caches as at start (a series cache the tests before it filled nearly full turns
# a page's lines away, and no layout is ever remembered for it).
pytestmark = pytest.mark.usefixtures("fresh")


def found_spy(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[bool]:
    """owner.name spied on: whether each call found something (returned other than None)."""
    found: list[bool] = []
    real = getattr(owner, name)

    def spy(*args):  # type: ignore[no-untyped-def]
        result = real(*args)
        found.append(result is not None)
        return result

    monkeypatch.setattr(owner, name, spy)
    return found


@pytest.fixture
def as_before(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each select() call read its page as one read before (the layout path)."""
    return found_spy(monkeypatch, expfmt, "_as_before")


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_a_recorded_page_read_again_with_new_values_reads_as_parse_reads_it(path: Path, as_before: list[bool]) -> None:
    text = path.read_text()
    for adapter in ADAPTERS:
        for step in range(4):
            page = _with_values(text, [str(step * 7 + i) for i in range(13)])
            for bounded in (False, True):
                _agree(page, adapter.NAMES, None, bounded)
    if _VALUE.search(text):
        assert any(as_before), "no page was read as one read before"


def test_the_vllm_page_is_read_as_before_from_its_third_reading(fresh: None, as_before: list[bool]) -> None:
    pages = [_with_values(VLLM_PAGE, [f"{n}.{i}" for i in range(9)]) for n in range(4)]
    selections = [expfmt.select(page, vllm.NAMES, prefixes=("vllm:",)) for page in pages]
    assert as_before == [False, False, True, True]  # the first page's lines were new: the second's were all known
    for page, selected in zip(pages, selections):
        parsed = expfmt._read(page, prefixes=("vllm:",), names=frozenset(vllm.NAMES), bounds=None)
        assert _by_name(selected.by_name) == _by_name(parsed.by_name)
        assert list(selected.by_name) == list(parsed.by_name)
    third, fourth = selections[2:]
    running = "vllm:num_requests_running"
    assert third.get(running)[0].value != fourth.get(running)[0].value  # each page's own values
    assert third.get(running)[0].labels is not fourth.get(running)[0].labels  # and labels of its own


@pytest.mark.parametrize("odd", ODD_VALUES)
def test_an_odd_value_on_a_known_page_reads_as_parse_reads_it(odd: str) -> None:
    known = _with_values(VLLM_PAGE, ["1"])
    for _ in range(2):
        expfmt.select(known, vllm.NAMES, prefixes=("vllm:",))  # its layout remembered
    for values in ([odd], ["3", odd, "4"]):
        page = _with_values(VLLM_PAGE, values)
        for bounded in (False, True):
            _agree(page, vllm.NAMES, ("vllm:",), bounded)


@FUZZ
@given(st.lists(st.one_of(st.sampled_from(ODD_VALUES), st.floats(allow_nan=True).map(repr),
                          st.text(alphabet="0123456789.e+-_ #xXaInf", max_size=8)), min_size=1, max_size=20))
def test_any_values_on_a_known_page_read_as_parse_reads_them(values: list[str]) -> None:
    known = _with_values(VLLM_PAGE, ["2"])
    for _ in range(2):
        expfmt.select(known, vllm.NAMES, prefixes=("vllm:",))
    page = _with_values(VLLM_PAGE, values)
    _agree(page, vllm.NAMES, ("vllm:",), bounded=False)
    _agree(page, vllm.NAMES, ("vllm:",), bounded=True)


def test_bounds_that_would_cut_a_known_page_cut_it_as_parse_does() -> None:
    page = _with_values(VLLM_PAGE, ["5"])
    for _ in range(2):
        expfmt.select(page, vllm.NAMES, prefixes=("vllm:",))
    n = sum(len(v) for v in expfmt.select(page, vllm.NAMES, prefixes=("vllm:",)).by_name.values())
    for max_samples, max_labels in ((n - 1, None), (n, None), (n + 1, None), (None, 3 * n), (None, 10 * n)):
        parsed, selected = (expfmt.Bounds(max_samples=max_samples, max_labels=max_labels) for _ in range(2))
        want = expfmt._read(page, prefixes=("vllm:",), names=frozenset(vllm.NAMES), bounds=parsed).by_name
        got = expfmt.select(page, vllm.NAMES, prefixes=("vllm:",), bounds=selected).by_name
        assert _by_name(got) == _by_name(want) and selected == parsed, (max_samples, max_labels)


def test_the_layouts_held_stay_within_their_bound(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages of ever new label sets (a new model name each) each leave a layout: what they are counted as
    holding stays under _LAYOUT_BYTES_MAX (here a twentieth of it, so forty pages pass it twice), and the latest
    page is still read as before."""
    monkeypatch.setattr(expfmt, "_LAYOUT_BYTES_MAX", expfmt._LAYOUT_BYTES_MAX // 20)
    finders = expfmt._finders(frozenset(vllm.NAMES), ("vllm:",))
    cleared = 0
    for n in range(40):
        page = VLLM_PAGE.replace('model_name="', f'model_name="m{n}-')
        before = len(expfmt._LAYOUTS)
        for _ in range(3):
            expfmt.select(page, vllm.NAMES, prefixes=("vllm:",))
        cleared += len(expfmt._LAYOUTS) <= before
        held = sum(expfmt.layout_bytes(keys) for keys in expfmt._LAYOUTS)
        assert held == expfmt._layout_bytes <= expfmt._LAYOUT_BYTES_MAX
        latest = tuple(key for block in expfmt._found(*finders[:2], page) for key, _, _ in block)
        assert latest in expfmt._LAYOUTS  # the latest page's
    assert cleared >= 2


def test_targets_whose_series_outgrow_the_series_cache_are_each_read_as_before(
        fresh: None, monkeypatch: pytest.MonkeyPatch, as_before: list[bool]) -> None:
    """Targets read in turn, their series a little more than the series cache holds (64 vLLM targets: ~8,500 for
    8,192): the pages whose lines did not fit are soon read as before too, not line by line at every scrape (the
    series of a page read by its layout leave the cache)."""
    targets = [VLLM_PAGE.replace('model_name="', f'model_name="t{n}-') for n in range(8)]
    expfmt.select(targets[0], vllm.NAMES, prefixes=("vllm:",))
    per_page = len(expfmt._SERIES)
    monkeypatch.setattr(expfmt, "_SERIES_MAX", per_page * len(targets) - per_page // 2)  # 7.5 pages' series
    expfmt._SERIES.clear()
    expfmt._series_chars = 0
    as_before.clear()
    for _ in range(8):  # a line on every page (the same key) leaves with the first page laid out: the next misses it
        for page in targets:
            expfmt.select(page, vllm.NAMES, prefixes=("vllm:",))
            assert len(expfmt._SERIES) <= expfmt._SERIES_MAX
    assert as_before[-3 * len(targets):] == [True] * 3 * len(targets), as_before
    assert not expfmt._SERIES and expfmt._series_chars == 0  # every page by its layout: none of them held


def test_pages_read_line_by_line_whose_series_outgrow_the_cache_still_mostly_hit(
        fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages never read by a layout (a timestamp on every line), eight of them through a cache of five pages'
    series: what it holds keeps hitting. Emptied whenever the lines it turned away over several parses passed half
    of it, it missed every line (and took 1.3-1.5x the CPU, its entries made and let go over and over)."""
    pages = ["".join(f'e:m{i}{{t="{n}",b="y"}} {i} 1700000000000\n' for i in range(200)) for n in range(8)]
    monkeypatch.setattr(expfmt, "_SERIES_MAX", 5 * 200)
    made = found_spy(monkeypatch, expfmt, "_remember")  # a line it did not find (made, or turned away)
    for _ in range(3):
        for page in pages:
            expfmt.select(page, SHORT_NAMES)
    made.clear()
    for _ in range(5):
        for page in pages:
            expfmt.select(page, SHORT_NAMES)
    assert len(made) <= 0.5 * 5 * len(pages) * 200  # 3 pages of 8 missed: 0.375


def _labels(count: int, value: str) -> str:
    return ",".join(f'l{j}="{value}"' for j in range(count))


def _in_a_fresh_process(measure: Callable[..., T], *args: object) -> T:
    """measure(*args) in a new interpreter: there tracemalloc counts the measure alone, where in a test worker it
    counts every thread's allocations, those of what earlier tests left running too (in a CI worker the vLLM
    pages' layouts and plans measured over the 3.35 MB they are counted as; alone they held 1.63)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure, *args).result(timeout=300)


SHORT_NAMES = [f"e:m{i}" for i in range(200)]


def _page_of(kind: str, n: int) -> str:
    """The n-th label set of a kind of page (layouts' memory)."""
    if kind == "short":
        return "".join(f'e:m{i}{{m="{n}"}} {i}\n' for i in range(200))
    if kind == "vllm":
        return VLLM_PAGE.replace('model_name="', f'model_name="m{n}-')
    if kind == "long labels":  # a Kubernetes pod's labels on every line: the key's characters held twice
        return "".join(f'e:m{i}{{pod="{"p" * 120}-{n}",node="{"n" * 80}"}} {i}\n' for i in range(200))
    if kind == "many labels":  # thirty short labels a line: each a dict entry and two strs (2.2x by characters)
        return "".join(f"e:m{i}{{{_labels(30, f'v{n}')}}} {i}\n" for i in range(200))
    assert kind == "one-bucket histograms"  # an attacker's page: 1,300 ranks of a one-bucket histogram each
    return "".join(f'vllm:iteration_tokens_total_bucket{{engine="{i}",model_name="m{n}",le="+Inf"}} 5\n'
                   f'vllm:iteration_tokens_total_count{{engine="{i}",model_name="m{n}"}} 5\n'
                   f'vllm:iteration_tokens_total_sum{{engine="{i}",model_name="m{n}"}} 9\n' for i in range(1300))


def _layouts_held(kind: str) -> tuple[int, int, int]:
    """Twenty label sets of a kind of page selected three times each: (bytes held, counted, layouts). Twenty
    many-label layouts (~620 kB each as counted) stay under _LAYOUT_BYTES_MAX: none is forgotten."""
    names, prefixes = (vllm.NAMES, ("vllm:",)) if kind == "vllm" else (SHORT_NAMES, None)
    expfmt.select(_page_of(kind, -1), names, prefixes=prefixes)  # the pattern compiled, the caches' first growth
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    for n in range(20):
        for _ in range(3):
            expfmt.select(_page_of(kind, n), names, prefixes=prefixes)
    expfmt._SERIES.clear()  # the layouts keep their labels; the series cache lets them go
    return tracemalloc.get_traced_memory()[0] - start, expfmt._layout_bytes, len(expfmt._LAYOUTS)


@pytest.mark.parametrize("kind", ["short", "vllm", "long labels", "many labels"])
def test_the_layouts_held_take_no_more_memory_than_they_are_counted_as(kind: str) -> None:
    """Layouts of short keys (a line little more than its name), of long ones, of many labels and of the vLLM
    page, each page a new label set, measured once the pages and selections are gone: within what they are
    counted as."""
    held, counted, layouts = _in_a_fresh_process(_layouts_held, kind)
    assert layouts >= 10
    assert held <= counted, (held, counted, layouts)


def _plans_held(kind: str, pages: int) -> tuple[int, int, int]:
    """Label sets of a kind of page read by vllm.parse three times each: (bytes held, counted, layouts planned)."""
    vllm.parse("vllm:num_requests_running 1\n", target="t", timestamp=1.0, duration=0.1)  # the pattern compiled
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    for n in range(pages):
        for _ in range(3):
            vllm.parse(_page_of(kind, n), target="t", timestamp=1.0, duration=0.1)
    expfmt._SERIES.clear()  # the layouts keep their labels; the series cache lets them go
    held = tracemalloc.get_traced_memory()[0] - start
    return held, expfmt._layout_bytes, sum(bool(layout.plans) for layout in expfmt._LAYOUTS.values())


@pytest.mark.parametrize(("kind", "pages"), [("vllm", 20), ("one-bucket histograms", 2)])
def test_the_layouts_and_their_plans_take_no_more_memory_than_they_are_counted_as(kind: str, pages: int) -> None:
    """Pages read by vllm.parse, each a new label set, three times each (its plans made on the third): the
    layouts and plans held, measured once the pages are gone, within what they are counted as (the one-bucket
    page's plans took 44% over before they were counted)."""
    held, counted, planned = _in_a_fresh_process(_plans_held, kind, pages)
    assert planned >= 2
    assert held <= counted, (held, counted)


def test_a_page_over_the_layout_size_is_read_without_a_copy_of_its_lines(fresh: None) -> None:
    """A page with one 4 MB label value: its line found whole, not split and joined again (one page-sized copy
    more: tracemalloc peak 25.2 MB against 21.0), and its labels read with one copy of the value, not looked for
    among the series read before (never held: over what they may hold) nor split and partitioned (21.0 -> 8.4 MB:
    the line and its value; the agent's RSS on this page touched 96-102 MB, tests/collectors/test_bounds.py)."""
    page = f'vllm:num_requests_running{{engine="0",model_name="{"x" * (4 * 2**20)}"}} 1\n'
    tracemalloc.start()
    try:
        selected = expfmt.select(page, vllm.NAMES, prefixes=("vllm:",), bounds=expfmt.Bounds(max_samples=100))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert selected.get("vllm:num_requests_running")[0].value == 1.0
    assert peak < 2.5 * len(page), f"{peak / 2**20:.1f} MiB for a {len(page) / 2**20:.1f} MiB page"


def test_a_page_read_in_a_worker_thread_never_uses_a_layout() -> None:
    """Only the event loop reads or writes the layouts: a page parsed in a worker thread is over their size."""
    from rooflight.agent.sampling import engine_loop

    assert expfmt._LAYOUT_MAX_CHARS <= engine_loop.PARSE_IN_THREAD_CHARS


def _generic(monkeypatch: pytest.MonkeyPatch) -> None:
    """histograms() and the adapters without plans: every page grouped as the first one is."""
    monkeypatch.setattr(expfmt, "_key_identity", lambda key: None)
    monkeypatch.setattr(expfmt, "planned", lambda exp, key, make: None)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_histograms_planned_on_a_known_page_are_those_grouped_anew(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every adapter's reading of a recorded page, read again with new values (odd ones among them: a NaN or
    negative bucket, +Inf, a missing value), is the same with histograms() planning on the page's layout as
    without."""
    text = path.read_text()
    planned: list[object] = []
    real = expfmt._planned

    def spy(lines, plan, *checked):  # type: ignore[no-untyped-def]
        planned.append(plan)
        return real(lines, plan, *checked)

    for step, values in enumerate(([str(i) for i in range(1, 14)], ["3", "NaN", "4", "-1", "+Inf", "5", "7"],
                                   [str(2 * i) for i in range(1, 14)], ["1", "2", "", "3"])):
        page = _with_values(text, values)
        for adapter in ADAPTERS:
            monkeypatch.setattr(expfmt, "_planned", spy)
            expfmt.select(page, adapter.NAMES, prefixes=None)  # the layout known before the reading compared
            expfmt.select(page, adapter.NAMES, prefixes=None)
            try:
                fast = adapter.parse(page, target="t", timestamp=1.0, duration=0.1)
            except Exception as exc:  # noqa: BLE001 - a page that has none of the adapter's families
                fast = repr(exc)
            with monkeypatch.context() as generic:
                _generic(generic)
                try:
                    slow = adapter.parse(page, target="t", timestamp=1.0, duration=0.1)
                except Exception as exc:  # noqa: BLE001
                    slow = repr(exc)
            assert fast == slow, (path.name, adapter.__name__, step)
    if path.name.startswith("vllm-"):
        assert any(planned), "no histogram was read by its plan"


HISTOGRAM_PAGE = """\
e:h_bucket{m="a",le="+Inf"} $0
e:h_bucket{m="a",le="0.5"} $1
e:h_bucket{m="a",le="0.1"} $2
e:h_count{m="a"} $0
e:h_sum{m="a"} 1.5
e:h_bucket{m="b",le="1"} $1
e:h_bucket{m="b",le="2"} $0
e:h_sum{m="b"} 2.5
e:h_bucket{m="c",le="1"} $1
e:h_count{m="c"} $0
"""
REPEATED_BOUND = """\
e:h_bucket{m="d",le="1"} $2
e:h_bucket{m="d",le="1.0"} $1
e:h_count{m="d"} $0
e:h_sum{m="d"} 0.5
"""


def _histogram_page(*values: str, page: str = HISTOGRAM_PAGE) -> str:
    for i, value in enumerate(values):
        page = page.replace(f"${i}", value)
    return page


@pytest.mark.parametrize("repeated", [False, True], ids=["planned", "a-bound-twice"])
@pytest.mark.parametrize("values", [("9", "5", "2"), ("-0.0", "0", "-0.0"), ("4", "NaN", "1"), ("3", "2", "-1"),
                                    ("+Inf", "1", "1")])
def test_histograms_planned_in_any_bucket_order_are_those_grouped_anew(values: tuple[str, str, str], repeated: bool,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Buckets written out of order, a histogram without its sum (`c`) or count (`b`: its +Inf bucket's is
    taken, here none); and with one whose bound is written twice (`d`: summed, never planned)."""
    names = ("e:h_bucket", "e:h_count", "e:h_sum")
    template = HISTOGRAM_PAGE + (REPEATED_BOUND if repeated else "")
    planned: list[object] = []
    real = expfmt._planned
    monkeypatch.setattr(expfmt, "_planned", lambda *args: planned.append(args[1]) or real(*args))

    def key(labels: dict[str, str]) -> str:
        return labels["m"]

    for warm in ("7", "8", "6"):  # the layout remembered, then a page read as before
        expfmt.histograms(expfmt.select(_histogram_page(warm, warm, warm, page=template), names), "e:h", key)
    page = _histogram_page(*values, page=template)
    fast = expfmt.histograms(expfmt.select(page, names), "e:h", key)
    assert bool(planned) is not repeated
    with monkeypatch.context() as generic:
        _generic(generic)
        slow = expfmt.histograms(expfmt.select(page, names), "e:h", key)
    assert fast == slow and list(fast) == list(slow)
    bucket_reprs = [{repr(v) for h in hs.values() for _, v in h.buckets} for hs in (fast, slow)]
    assert bucket_reprs[0] == bucket_reprs[1]


class _ByLabel:
    def __init__(self, label: str) -> None:
        self.label = label

    def key(self, labels: dict[str, str]) -> str:
        return labels.get(self.label, "")


def test_key_functions_that_differ_by_more_than_their_code_are_never_planned_as_one() -> None:
    """A bound method (its state), a closure (its cells) and a function with defaults give what more than their
    code decides: each reads the page as the generic grouping does, never by another's plan."""
    page = 'e:h_bucket{m="a",n="x",le="+Inf"} 1\ne:h_count{m="a",n="x"} 1\ne:h_sum{m="a",n="x"} 1\n' \
           'e:h_bucket{m="b",n="y",le="+Inf"} 2\ne:h_count{m="b",n="y"} 2\ne:h_sum{m="b",n="y"} 2\n'
    names = ("e:h_bucket", "e:h_count", "e:h_sum")
    for _ in range(3):
        selected = expfmt.select(page, names)
    assert selected.layout is not None

    def by(label: str):  # type: ignore[no-untyped-def]
        return lambda labels: labels.get(label, "")

    def with_default(labels: dict[str, str], label: str = "m") -> str:
        return labels.get(label, "")

    for first, second in ((_ByLabel("m").key, _ByLabel("n").key), (by("m"), by("n"))):
        assert list(expfmt.histograms(selected, "e:h", first)) == ["a", "b"]
        assert list(expfmt.histograms(selected, "e:h", second)) == ["x", "y"]
    assert list(expfmt.histograms(selected, "e:h", with_default)) == ["a", "b"]
    assert expfmt._key_identity(with_default) is None and expfmt._key_identity(_ByLabel("m").key) is None


MULTIPROCESS_PAGE = "".join(
    f'vllm:{name}{{engine="{rank}",model_name="m",pid="{pid}"}} $\n'
    for rank in ("0", "1") for pid in ("11", "12", "11")  # pid 11 twice: the last one counts
    for name in ("kv_cache_usage_perc", "num_requests_running", "generation_tokens_total", "prompt_tokens_total")
) + 'vllm:num_preemptions_total{engine="0",model_name="m"} $\n'


@pytest.mark.parametrize("values", [("3", "1", "4", "1", "5"), ("NaN", "2", "-1", "+Inf", "-0.0"), ("-0.0",),
                                    ("0.5", "-0.0", "7")])
def test_vllm_values_planned_on_a_multiprocess_page_are_those_combined_anew(values: tuple[str, ...],
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Gauges split over API-server pids take their max, counters their sum, the last of a pid's repeated lines
    counting, bad parts dropped: by the plan made on the page's layout as when each page is grouped anew."""
    def page(fill: tuple[str, ...]) -> str:
        count = iter(range(1 << 30))
        return re.sub(r"\$", lambda _: fill[next(count) % len(fill)], MULTIPROCESS_PAGE)

    used: list[object] = []
    real = vllm._values_planned
    monkeypatch.setattr(vllm, "_values_planned", lambda *args: used.append(args[1]) or real(*args))
    for warm in ("1", "2", "3"):
        vllm.parse(page((warm,)), target="t", timestamp=1.0, duration=0.1)
    fast = vllm.parse(page(values), target="t", timestamp=1.0, duration=0.1)
    assert used and any(len(lines) == 2 for plan in used for _, lines in plan)  # per (model, rank): pids 11 and 12
    with monkeypatch.context() as generic:
        _generic(generic)
        slow = vllm.parse(page(values), target="t", timestamp=1.0, duration=0.1)
    assert fast == slow
    totals = [[repr(s.generation_tokens_total) for s in sample.series] for sample in (fast, slow)]
    assert totals[0] == totals[1]
