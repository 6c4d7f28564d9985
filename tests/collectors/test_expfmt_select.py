"""select() finds the lines of the kept names with one regular expression instead of stepping through
every line: what it returns, and what it counts into the Bounds, must be exactly parse()'s `by_name`.

The pages are test_expfmt_skip's, built to trip a reader that is too eager (kept names that are prefixes
or extensions of unread ones, odd spacing, exemplars, timestamps, bad values), each also in the shape
real engines write (no line starting with whitespace or `{`), which select() reads without parse().
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rooflight.collectors import dynamo, expfmt, llamacpp, sglang, tgi, triton_trtllm, trtllm, vllm
from test_expfmt_skip import KEPT, _comparable, _page
from test_fuzz import FUZZ, _mutated_page

PAGES = sorted((Path(__file__).parents[1] / "fixtures" / "engine-samples").glob("*.prom"))
ADAPTERS = (vllm, sglang, tgi, trtllm, triton_trtllm, llamacpp, dynamo)
PARSE = expfmt._read  # parse() without its ParseError; the tests below spy on the module's name for it


def _canonical(text: str) -> str:
    """The page without leading whitespace and without `{__name__=...}` lines: select() reads it itself."""
    lines = (line.lstrip() for line in text.split("\n"))
    return "\n".join(line for line in lines if not line.startswith("{"))


def _bounds() -> expfmt.Bounds:
    return expfmt.Bounds(max_samples=6, max_labels=20)


def _by_name(found: dict[str, list[expfmt.Sample]]) -> dict[str, list[tuple[object, ...]]]:
    return {name: [_comparable(s) for s in samples] for name, samples in found.items()}


def _agree(text: str, names: frozenset[str] | tuple[str, ...], prefixes: tuple[str, ...] | None,
           bounded: bool) -> None:
    parsed_bounds, selected_bounds = (_bounds(), _bounds()) if bounded else (None, None)
    parsed = PARSE(text, prefixes=prefixes, names=names, bounds=parsed_bounds)
    selected = expfmt.select(text, names, prefixes=prefixes, bounds=selected_bounds)
    assert _by_name(selected.by_name) == _by_name(parsed.by_name), text
    assert list(selected.by_name) == list(parsed.by_name), text  # names in order of first appearance
    if bounded:
        assert parsed_bounds == selected_bounds, text


def _reads_itself(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every page select() hands to parse()."""
    handed: list[str] = []

    def spy(text: str, **kw: object) -> expfmt.Exposition:
        handed.append(text)
        return PARSE(text, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(expfmt, "_read", spy)
    return handed


@pytest.mark.parametrize("seed", range(300))
def test_same_samples_and_counts_as_parse_on_pages_built_to_trip_it(seed: int) -> None:
    for text in (_page(seed), _canonical(_page(seed))):
        for prefixes in (None, ("e:",), ("e:a",)):
            for bounded in (False, True):
                _agree(text, KEPT, prefixes, bounded)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_same_samples_as_parse_on_every_recorded_page_for_every_adapter(path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    text = path.read_text()
    handed = _reads_itself(monkeypatch)
    for adapter in ADAPTERS:
        for bounded in (False, True):
            _agree(text, adapter.NAMES, None, bounded)
    assert not handed, "a recorded engine page went to parse()"


def test_the_canonical_pages_are_read_without_parse_and_keep_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    handed = _reads_itself(monkeypatch)
    kept = sum(len(samples) for seed in range(300)
               for samples in expfmt.select(_canonical(_page(seed)), KEPT).by_name.values())
    assert not handed and kept > 300


@pytest.mark.parametrize("odd", [" e:a 1", "\te:a 1", '{__name__="e:a"} 1', "\re:a 1", "1e:a 2", "  ", "\r",
                                 '{__name__="other"} 3', " # TYPE e:a gauge", "\u2028e:a 4"])
def test_a_line_no_name_starts_is_read_in_place_as_parse_reads_it(odd: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not by reading the page again with parse(): a hostile page ending in one such line would cost twice."""
    handed = _reads_itself(monkeypatch)
    for page in (f"e:g 1\n{odd}\ne:g 2\n", f"{odd}\ne:g 2", odd):
        for bounded in (False, True):
            _agree(page, KEPT, None, bounded)
            _agree(page, KEPT, ("e:",), bounded)
    assert not handed


def test_a_series_remembered_from_an_unfiltered_parse_does_not_widen_the_filter() -> None:
    """`name<VT>{...}` is the name `name` to an unfiltered parse and another name to a filtered one: the
    series cache must not let select() keep it after such a parse remembered it."""
    page = 'e:a\x0b{k="v"} 7\ne:a\x85{k="w"} 8\ne:a {k="x"} 9\n'
    expfmt.parse(page)  # an unfiltered parse first: what it remembers is shared
    for bounded in (False, True):
        _agree(page, KEPT, None, bounded)


def test_a_kept_name_followed_by_more_name_is_another_name() -> None:
    page = "e:a_totals 1\ne:a-b 2\ne:a.x 3\ne:a 4\ne:a_total{k=\"v\"} 5\ne:a\t6\ne:a {k=\"w\"} 7\n"
    selected = expfmt.select(page, KEPT)
    assert {name: [s.value for s in samples] for name, samples in selected.by_name.items()} == {
        "e:a": [4.0, 6.0, 7.0], "e:a_total": [5.0]}
    assert selected.bad_lines == 0  # `e:a-b` is not a kept sample that failed to parse: it is not kept
    capped = expfmt.Bounds(max_samples=1)
    assert expfmt.select("e:a 1\ne:a-b 2\ne:a x\n", KEPT, bounds=capped).bad_lines == 0
    assert capped.samples_dropped == 1  # past the cap, only the kept `e:a x` is counted
    assert expfmt.select("e:a 1\ne:a-b 2\ne:a x\n", KEPT).bad_lines == 1


def test_a_page_of_one_line_and_an_empty_page() -> None:
    assert [s.value for s in expfmt.select("e:g 3", KEPT).get("e:g")] == [3.0]
    assert expfmt.select("", KEPT).by_name == {}
    assert expfmt.select("e:g 3", ()).by_name == {}


@FUZZ
@given(st.text(max_size=400))
def test_any_text_reads_as_parse_reads_it(text: str) -> None:
    _agree(text, KEPT, None, bounded=True)
    _agree("e:a 1\n" + text, KEPT, None, bounded=False)


@FUZZ
@given(_mutated_page())
def test_mutated_vllm_pages_read_as_parse_reads_them(text: str) -> None:
    _agree(text, vllm.NAMES, ("vllm:",), bounded=True)


def test_a_page_of_many_short_lines_is_read_one_line_at_a_time() -> None:
    """A page of blank lines that start with a space (each one a line the pattern finds, to be skipped) must
    not exist as a list of lines at once: a findall over a page the agent accepts (4 MiB) held ~130 MiB."""
    import tracemalloc

    text = (PAGES[0].parent / "vllm-cpu-load-c16.prom").read_text() + " \n" * (512 * 1024)
    tracemalloc.start()
    try:
        selected = expfmt.select(text, ["vllm:num_requests_running"], prefixes=("vllm:",))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert selected.get("vllm:num_requests_running"), "the page's own samples are still read"
    assert peak < 4 * 2**20, f"select on a {len(text)}-byte page peaked at {peak / 2**20:.1f} MiB"
