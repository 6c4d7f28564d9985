"""collectors/expfmt must read exactly what prometheus_client's parser reads, only faster and tolerant.

Equality is checked on every recorded engine page in tests/fixtures/engine-samples/ and on random
expositions rendered by prometheus_client itself (hypothesis); the tolerance cases are unit tests.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.parser import text_string_to_metric_families

from rooflight.collectors import expfmt
from rooflight.collectors.errors import ParseError
from support import SAMPLES

SAMPLE_FILES = sorted(SAMPLES.glob("*.prom"))


def _v(value: float) -> object:
    return "NaN" if value != value else float(value)


def reference(text: str) -> list[tuple]:
    """prometheus_client's reading: (family, type, help, [(name, labels, value, ts)])."""
    return [
        (f.name, f.type, f.documentation, [(s.name, s.labels, _v(s.value), s.timestamp) for s in f.samples])
        for f in text_string_to_metric_families(text)
    ]


def ours(text: str) -> list[tuple]:
    """Our reading, with prometheus_client's counter renaming applied (we keep wire names)."""
    out = []
    for fam in expfmt.parse(text).families:
        name = fam.name
        samples = [(s.name, s.labels, _v(s.value), s.timestamp) for s in fam.samples]
        if fam.type == "counter":
            if name.endswith("_total"):
                name = name[:-6]
            else:
                samples = [(n + "_total", *rest) for n, *rest in samples]
        out.append((name, fam.type, fam.help, samples))
    return out


def test_the_shared_samples_are_there() -> None:
    # Guards the parametrized test below against silently running on nothing.
    names = {p.name for p in SAMPLE_FILES}
    assert {"vllm-cpu-load-c16.prom", "vllm-cpu-rest-fresh.prom", "vllm-cpu-preempt-during.prom"} <= names
    assert len(SAMPLE_FILES) >= 10


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.name)
def test_same_as_prometheus_client_on_every_recorded_page(path: Path) -> None:
    text = path.read_text()
    exp = expfmt.parse(text)
    assert exp.bad_lines == 0
    assert ours(text) == reference(text)
    assert len(exp) == sum(len(f[3]) for f in reference(text))


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.name)
def test_filters_keep_exactly_the_asked_samples(path: Path) -> None:
    text = path.read_text()
    full = expfmt.parse(text)
    prefix = sorted(full.by_name)[len(full.by_name) // 2].split(":")[0].split("_")[0]
    by_prefix = expfmt.parse(text, prefixes=(prefix,))
    assert _flat(by_prefix.by_name) == _flat({n: s for n, s in full.by_name.items() if n.startswith(prefix)})
    picked = set(sorted(full.by_name)[::3])
    by_names = expfmt.parse(text, names=picked)
    assert _flat(by_names.by_name) == _flat({n: full.by_name[n] for n in picked})
    full_types = {s.name: f.type for f in full.families for s in f.samples}
    assert {s.name: f.type for f in by_names.families for s in f.samples} == {
        n: full_types[n] for n in picked
    }


def test_vllm_filter_sees_histogram_parts_with_their_family_type() -> None:
    text = (SAMPLES / "vllm-cpu-load-c16.prom").read_text()
    wanted = {"vllm:iteration_tokens_total_count", "vllm:time_to_first_token_seconds_bucket"}
    exp = expfmt.parse(text, prefixes=("vllm:",), names=wanted)
    assert [(f.name, f.type, len(f.samples)) for f in exp.families] == [
        ("vllm:iteration_tokens_total", "histogram", 1),
        ("vllm:time_to_first_token_seconds", "histogram", 23),
    ]
    assert exp.get("vllm:iteration_tokens_total_count")[0].value == 508.0


def test_escapes_in_label_values_and_help() -> None:
    text = (
        '# HELP m A \\\\ backslash and a \\n newline\n'
        "# TYPE m gauge\n"
        'm{path="C:\\\\dir",quote="say \\"hi\\"",nl="a\\nb",brace="}{",comma="a,b=c"} 1\n'
    )
    exp = expfmt.parse(text)
    (fam,) = exp.families
    assert fam.help == "A \\ backslash and a \n newline"
    assert fam.samples[0].labels == {
        "path": "C:\\dir",
        "quote": 'say "hi"',
        "nl": "a\nb",
        "brace": "}{",
        "comma": "a,b=c",
    }
    assert ours(text) == reference(text)


def test_le_quantile_special_values_and_timestamps() -> None:
    text = (
        "# TYPE h histogram\n"
        'h_bucket{le="0.5"} 1\nh_bucket{le="1e1"} 2\nh_bucket{le="+Inf"} 3\n'
        "h_count 3\nh_sum 4.5\n"
        "# TYPE s summary\n"
        's{quantile="0.99"} NaN\ns_count 0\ns_sum 0\n'
        "g +Inf 1700000000123\n"
        "n -Inf\n"
    )
    exp = expfmt.parse(text)
    assert [float(s.labels["le"]) for s in exp.get("h_bucket")] == [0.5, 10.0, math.inf]
    assert math.isnan(exp.get("s")[0].value)
    (g,) = exp.get("g")
    assert g.value == math.inf and g.timestamp == pytest.approx(1700000000.123)
    assert exp.get("n")[0].value == -math.inf
    assert ours(text) == reference(text)


def test_eof_exemplars_blank_lines_and_spacing_are_tolerated() -> None:
    text = (
        "# TYPE c_total counter\n"
        '\n  c_total{a="1"} 5 # {trace_id="abc"} 1.0 1700000000\n'
        'c_total { a = "2" , } 6\r\n'
        "plain\t7\n"
        "# EOF\n"
    )
    exp = expfmt.parse(text)
    assert exp.bad_lines == 0
    assert [(s.labels, s.value, s.timestamp) for s in exp.get("c_total")] == [
        ({"a": "1"}, 5.0, None),
        ({"a": "2"}, 6.0, None),
    ]
    assert exp.get("plain")[0].value == 7.0


def test_bad_lines_are_counted_not_fatal() -> None:
    text = 'good 1\nbad{a="1" 2\nworse\nalso_bad 1_000\nx{a="1",a="2"} 3\nfine{b="2"} 4\n'
    exp = expfmt.parse(text)
    assert exp.bad_lines == 4
    assert sorted(exp.by_name) == ["fine", "good"]


def test_nothing_parsable_is_a_parse_error() -> None:
    with pytest.raises(ParseError) as err:
        expfmt.parse("<html>\n<body>502 Bad Gateway</body>\n</html>\n")
    assert err.value.reason == "parse"


def test_comments_only_is_an_empty_exposition_not_an_error() -> None:
    exp = expfmt.parse("# just a comment\n\n# TYPE x gauge\n")
    assert exp.by_name == {} and exp.bad_lines == 0
    assert [(f.name, f.type) for f in exp.families] == [("x", "gauge")]


def test_histograms_groups_sums_pids_and_drops_nonfinite() -> None:
    text = (
        "# TYPE t histogram\n"
        't_bucket{m="a",pid="1",le="1"} 1\nt_bucket{m="a",pid="1",le="+Inf"} 2\n'
        't_bucket{m="a",pid="2",le="1"} 3\nt_bucket{m="a",pid="2",le="+Inf"} 4\n'
        't_count{m="a",pid="1"} 2\nt_count{m="a",pid="2"} 4\n'
        't_sum{m="a",pid="1"} 1.5\nt_sum{m="a",pid="2"} 2.5\n'
        't_bucket{m="b",le="1"} NaN\nt_bucket{m="b",le="+Inf"} 1\nt_count{m="b"} 1\nt_sum{m="b"} 1\n'
    )
    hists = expfmt.histograms(expfmt.parse(text), "t", lambda labels: labels.get("m"))
    assert set(hists) == {"a"}
    assert hists["a"].buckets == ((1.0, 4.0), (math.inf, 6.0))
    assert (hists["a"].count, hists["a"].sum) == (6.0, 4.0)


@pytest.mark.parametrize("odd", ["NaN", "+Inf", "-Inf", "-1", "-0"])
@pytest.mark.parametrize("at", ["first bucket", "middle bucket", "last bucket", "count", "sum"])
def test_a_histogram_with_a_value_out_of_range_anywhere_is_dropped(odd: str, at: str) -> None:
    """Every count in [0, inf) and the sum finite, wherever the odd value sits (a NaN first or later alike)."""
    values = {"first bucket": "1", "middle bucket": "2", "last bucket": "3", "count": "3", "sum": "4.5"}
    values[at] = odd
    text = (f't_bucket{{le="0.1"}} {values["first bucket"]}\nt_bucket{{le="1"}} {values["middle bucket"]}\n'
            f't_bucket{{le="+Inf"}} {values["last bucket"]}\nt_count {values["count"]}\nt_sum {values["sum"]}\n')
    hists = expfmt.histograms(expfmt.parse(text), "t", lambda labels: "k")
    kept = odd == "-0" or (at == "sum" and odd == "-1")  # -0 is 0; a sum may be negative (observed values can be)
    assert set(hists) == ({"k"} if kept else set())


# --- property: anything prometheus_client renders, we read back identically ----------------------

_label_text = st.text(
    alphabet=st.sampled_from(list('ab zZ09_-.:/"\\\n{}=,#é\t')), min_size=0, max_size=12
)
_label_names = st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), max_size=3, unique=True).map(
    lambda names: [n for n in names if n not in ("le", "quantile") and not n.startswith("__")]
)
_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=0, max_value=2**40).map(float),
)
_timestamps = st.one_of(st.none(), st.integers(min_value=0, max_value=2_000_000_000_000).map(lambda ms: ms / 1000))


@st.composite
def _families(draw: st.DrawFn) -> list:
    families = []
    for i in range(draw(st.integers(min_value=1, max_value=5))):
        kind = draw(st.sampled_from(["counter", "gauge", "histogram", "summary"]))
        name = f"m{i}_" + draw(st.from_regex(r"[a-z:][a-z0-9_:]{0,8}", fullmatch=True))
        doc = draw(_label_text)
        label_names = draw(_label_names)
        series = draw(
            st.lists(st.tuples(*[_label_text] * len(label_names)), max_size=3, unique=True)
        )
        if kind == "counter":
            fam = CounterMetricFamily(name, doc, labels=label_names)
            for values in series:
                fam.add_metric(list(values), abs(draw(_values)), timestamp=draw(_timestamps))
        elif kind == "gauge":
            fam = GaugeMetricFamily(name, doc, labels=label_names)
            for values in series:
                fam.add_metric(list(values), draw(_values), timestamp=draw(_timestamps))
        elif kind == "histogram":
            fam = HistogramMetricFamily(name, doc, labels=label_names)
            bounds = sorted(set(draw(st.lists(st.floats(-1e6, 1e6), max_size=4))))
            for values in series:
                counts = sorted(draw(st.lists(st.integers(0, 10**6), min_size=len(bounds) + 1, max_size=len(bounds) + 1)))
                buckets = [(repr(b), float(c)) for b, c in zip(bounds, counts)] + [("+Inf", float(counts[-1]))]
                fam.add_metric(list(values), buckets, draw(_values))
        else:
            fam = SummaryMetricFamily(name, doc, labels=label_names)
            for values in series:
                fam.add_metric(list(values), draw(st.integers(0, 10**6)), draw(_values))
        families.append(fam)
    return families


class _Fixed:
    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> list:
        return self.families


@settings(max_examples=150, deadline=None)
@given(_families())
def test_round_trips_whatever_prometheus_client_renders(families: list) -> None:
    registry = CollectorRegistry()
    registry.register(_Fixed(families))
    text = generate_latest(registry).decode()
    assert ours(text) == reference(text)
    full = expfmt.parse(text)
    assert full.bad_lines == 0
    picked = set(sorted(full.by_name)[::2])
    assert _flat(expfmt.parse(text, names=picked).by_name) == _flat({n: full.by_name[n] for n in picked})


def _flat(by_name: dict[str, list[expfmt.Sample]]) -> dict[str, list[tuple]]:
    return {n: [(s.labels, _v(s.value), s.timestamp) for s in samples] for n, samples in by_name.items()}


def test_seen_series_cache_is_invisible_to_callers() -> None:
    text = 'c_total{a="1",b="x"} 5\nc_total{a="1",b="x"} 6 1500\n'
    first = expfmt.parse(text)
    first.get("c_total")[0].labels["a"] = "mutated"
    second = expfmt.parse(text)
    assert [(s.labels, s.value, s.timestamp) for s in second.get("c_total")] == [
        ({"a": "1", "b": "x"}, 5.0, None),
        ({"a": "1", "b": "x"}, 6.0, 1.5),
    ]
    assert second.get("c_total")[0].labels is not second.get("c_total")[1].labels


@pytest.mark.parametrize("size", [10, 65_531, 65_540, 2 << 20])
def test_a_line_reads_the_same_whatever_the_length_of_its_labels(size: int) -> None:
    """Labels over a length must not be read by the other path, whose rule for a label's name differs
    (`a:b`, as prometheus_client reads it): a line would be read or refused by its length alone."""
    value = "x" * size
    for bounds in (None, expfmt.Bounds(max_samples=10)):
        exp = expfmt.parse(f'm{{a:b="{value}",c="1"}} 2\n', bounds=bounds)
        (sample,) = exp.get("m")
        assert (sample.value, sample.labels["c"]) == (2.0, "1")
        cut = bounds is not None and size > expfmt.MAX_LABEL_VALUE_CHARS
        assert sample.labels["a:b"] == (value[: expfmt.MAX_LABEL_VALUE_CHARS] + expfmt.TRUNCATED_MARK if cut else value)
        assert exp.labels_truncated == cut
