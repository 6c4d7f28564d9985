"""vllm.parse reads a page whose layout it read before by a plan of where each field's value lies
(vllm._page_plan): whatever the values, what it returns and what it counts must be exactly what grouping the
page's samples anew gives, and a page the plan cannot read (a value that is not a good number, a series split
over pids, LoRA, too many series, an implausible cache config) is grouped anew.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rooflight.collectors import expfmt, vllm
from rooflight.collectors.common import page_bounds
from rooflight.collectors.errors import ParseError
from test_expfmt_layout import MULTIPROCESS_PAGE, _generic, _with_values, found_spy, fresh  # noqa: F401 (fresh: a fixture)

# Every test here starts with no series and no layout known: whether a page is read by its plan depends on the
# caches, which the tests before it on the same worker fill (a series cache nearly full turns a page's lines away
# and no layout is ever remembered for it: a CI run read vllm-dp2-tp1.prom line by line so).
pytestmark = pytest.mark.usefixtures("fresh")

SAMPLES = Path(__file__).parents[1] / "fixtures" / "engine-samples"
PAGES = {path.name: path.read_text() for path in (*sorted(SAMPLES.glob("vllm-*.prom")),
                                                   SAMPLES / "synthetic" / "vllm-dp2-tp1.prom")}
# Both spellings of a family for one series, the old alone for another: the newer name is preferred per series.
PAGES["old-and-new-names"] = PAGES["vllm-cpu-load-c16.prom"] + "".join(
    f'vllm:{name}{{engine="{rank}",model_name="tiny-llama"}} 0.5\n'
    for name in ("gpu_cache_usage_perc", "gpu_prefix_cache_hits_total", "gpu_prefix_cache_queries_total")
    for rank in ("0", "1"))
# A rank with nothing but its steps' buckets and sum (no count, so no steps_total): its series is made by the sum.
# Histograms without their +Inf bucket end at their count.
PAGES["steps-alone"] = PAGES["vllm-cpu-load-c16.prom"] + "".join(
    line.replace('engine="0"', 'engine="1"') + "\n" for line in PAGES["vllm-cpu-load-c16.prom"].splitlines()
    if line.startswith(("vllm:iteration_tokens_total_bucket", "vllm:iteration_tokens_total_sum")))
PAGES["no-inf-buckets"] = "".join(line + "\n" for line in PAGES["vllm-cpu-load-c16.prom"].splitlines()
                                  if 'le="+Inf"' not in line)
PAGES["ttft-without-inf-or-count"] = "".join(  # no count to end it at: the histogram is left out
    line + "\n" for line in PAGES["vllm-cpu-load-c16.prom"].splitlines()
    if not line.startswith("vllm:time_to_first_token_seconds_count") and not (
        line.startswith("vllm:time_to_first_token_seconds_bucket") and 'le="+Inf"' in line))
GOOD = st.sampled_from(["0", "-0.0", "1", "2.5", "7e3", "1e-9", "12345678901234567890", "0.25", "+0"])
ODD = st.sampled_from(["NaN", "+Inf", "-1", "-Inf", "1_0", ""])


@pytest.fixture
def plans_read(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each parse read its page by the page's plan."""
    return found_spy(monkeypatch, vllm, "_read_planned")


def _both(page: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, dict[str, int], dict[str, int]]:
    """The page parsed with plans (its layout known: read twice before) and grouped anew, as reprs (a -0.0 is
    told from 0.0 there; a page of no good value is an error either way), and the values each dropped."""
    def parsed() -> str:
        try:
            return repr(vllm.parse(page, target="t", timestamp=1.0, duration=0.1))
        except ParseError as exc:
            return repr(exc)

    for _ in range(2):
        parsed()
    with expfmt.bounded(page_bounds(100_000)) as fast_bounds:
        fast = parsed()
    with monkeypatch.context() as generic:
        _generic(generic)
        with expfmt.bounded(page_bounds(100_000)) as slow_bounds:
            slow = parsed()
    return fast, slow, fast_bounds.values_dropped, slow_bounds.values_dropped


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(PAGES)), values=st.lists(GOOD, min_size=1, max_size=12))
def test_a_planned_page_of_good_values_reads_as_one_grouped_anew(name: str, values: list[str]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        read = found_spy(patch, vllm, "_read_planned")
        fast, slow, fast_dropped, slow_dropped = _both(_with_values(PAGES[name], values), patch)
    assert read and all(read), "the page was not read by its plan"
    assert fast == slow
    assert fast_dropped == slow_dropped


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(PAGES)), values=st.lists(GOOD | ODD, min_size=1, max_size=12))
def test_a_planned_page_of_any_values_reads_as_one_grouped_anew(name: str, values: list[str]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        fast, slow, fast_dropped, slow_dropped = _both(_with_values(PAGES[name], values), patch)
    assert fast == slow
    assert fast_dropped == slow_dropped


def test_every_recorded_page_is_read_by_its_plan(plans_read: list[bool], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, text in PAGES.items():
        plans_read.clear()
        fast, slow, _, _ = _both(text, monkeypatch)
        assert plans_read and all(plans_read[1:]), name  # the first reading of a layout makes no plan
        assert fast == slow, name


def _lora(page: str) -> str:
    return page + ('vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",waiting_lora_adapters=""}'
                   ' 1700000100.0\nvllm:lora_requests_info{max_lora="4",running_lora_adapters="sql",'
                   'waiting_lora_adapters="chat"} 1700000050.0\n')


def _ranks(n: int) -> str:
    return "".join(f'vllm:num_requests_running{{engine="{i}",model_name="m"}} {i}\n' for i in range(n))


UNPLANNED = {
    "a value not a number": _with_values(PAGES["vllm-cpu-load-c16.prom"], ["3", "NaN", "4"]),
    "a negative counter": _with_values(PAGES["vllm-cpu-load-c16.prom"], ["3", "-1", "4"]),
    "series split over pids": MULTIPROCESS_PAGE.replace("$", "3"),
    "parts split over pids": ('vllm:num_requests_waiting_by_reason{engine="0",model_name="m",pid="1",reason="capacity"}'
                              ' 2\nvllm:num_requests_waiting_by_reason{engine="0",model_name="m",pid="2",'
                              'reason="capacity"} 5\nvllm:num_requests_running{engine="0",model_name="m"} 1\n'),
    "LoRA": _lora(PAGES["vllm-cpu-load-c16.prom"]),
    "too many series": _ranks(vllm._PLANNED_SERIES_MAX + 1),
    "an implausible cache config": PAGES["vllm-cpu-load-c16.prom"].replace('kv_cache_size_tokens="1048576"',
                                                                     'kv_cache_size_tokens="0"'),
}


@pytest.mark.parametrize("kind", sorted(UNPLANNED))
def test_a_page_the_plan_cannot_read_is_grouped_anew(kind: str, plans_read: list[bool],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow, fast_dropped, slow_dropped = _both(UNPLANNED[kind], monkeypatch)
    assert not any(plans_read)
    assert fast == slow
    assert fast_dropped == slow_dropped
    if kind == "an implausible cache config":
        assert fast_dropped  # counted on every page, as grouped anew


def test_a_plan_is_made_for_as_many_series_as_it_may_hold(plans_read: list[bool],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow, _, _ = _both(_ranks(vllm._PLANNED_SERIES_MAX), monkeypatch)
    assert plans_read and all(plans_read[1:])
    assert fast == slow


_RUNNING = 'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
# Small pages, each of a reading a wrong plan would give differently (a reviewer's mutants of the plan): the page's
# `$` is 0 for its first readings (the plan made then), then the value given.
HAND_PAGES = {
    "a NaN after a good value": (_RUNNING + 'vllm:num_requests_waiting{engine="0",model_name="m"} $\n', "NaN"),
    "the lowest rank's config": (_RUNNING + 'vllm:cache_config_info{block_size="16",engine="0"} 1\n'
                                 'vllm:cache_config_info{block_size="32",engine="1"} 1\n', "1"),
    "the newer ITL name": ('vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2\n'
                           'vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 1\n'
                           'vllm:time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 3\n'
                           'vllm:time_per_output_token_seconds_sum{engine="0",model_name="m"} 1\n', "1"),
    "a source named all": ('vllm:prompt_tokens_total{engine="0",model_name="m"} 5\n'
                           'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="all"} $\n', "7"),
    "the last of a repeated reason": (
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 1\n'
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} $\n', "2"),
    "a series made by its reasons alone": (
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} $\n', "1"),
    "the last of a rank's configs": (_RUNNING + 'vllm:cache_config_info{block_size="16",engine="0"} 1\n'
                                     'vllm:cache_config_info{block_size="32",engine="0"} 1\n', "1"),
    "a histogram without its sum makes no series": (
        _RUNNING + 'vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 2\n', "1"),
    "LoRA at 0 when the plan is made": (
        _RUNNING + 'vllm:lora_requests_info{max_lora="4",running_lora_adapters="a",waiting_lora_adapters=""} $\n',
        "1700000000"),
}


@pytest.mark.parametrize("kind", sorted(HAND_PAGES))
@pytest.mark.parametrize("max_series", [100_000, 1])
def test_small_pages_read_by_their_plan_as_grouped_anew(kind: str, max_series: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Also under Bounds that cut the page (no layout then: each is read line by line), every count equal."""
    page, value = HAND_PAGES[kind]

    def parsed() -> tuple[str, expfmt.Bounds]:
        with expfmt.bounded(page_bounds(max_series)) as bounds:
            try:
                return repr(vllm.parse(page.replace("$", value), target="t", timestamp=1.0, duration=0.1)), bounds
            except ParseError as exc:
                return repr(exc), bounds

    for _ in range(3):
        with expfmt.bounded(page_bounds(max_series)):
            vllm.parse(page.replace("$", "0"), target="t", timestamp=1.0, duration=0.1)
    fast, fast_bounds = parsed()
    with monkeypatch.context() as generic:
        _generic(generic)
        slow, slow_bounds = parsed()
    assert fast == slow
    assert fast_bounds == slow_bounds


def _long_settings(n: int) -> str:
    """256 ranks whose cache configs state every setting at 100 characters (cut when read: a new string each)."""
    out = []
    for rank in range(256):
        config = ",".join(f'{key}="{chr(97 + j) * 100}{n}"' for j, key in enumerate(vllm.SETTINGS))
        out.append(f'vllm:cache_config_info{{engine="{rank}",{config}}} 1\n'
                   f'vllm:num_requests_running{{engine="{rank}",model_name="m{n}"}} 1\n')
    return "".join(out)


@pytest.mark.usefixtures("fresh")
def test_a_plan_holds_no_more_than_it_is_counted_as() -> None:
    """What a page plan holds (measured with tracemalloc, the page's samples gone) is within what the layouts'
    bound counts it as, the strings it made included."""
    page = _long_settings(0)
    for _ in range(2):
        vllm.parse(page, target="t", timestamp=1.0, duration=0.1)
    exp = expfmt.select(page, vllm.NAMES, prefixes=("vllm:",))
    assert exp.layout is not None
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        plan = vllm._page_plan(exp)
        del exp
        held = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert plan is not None and len(plan.series) == 256
    assert held <= expfmt._plan_bytes(plan), (held, expfmt._plan_bytes(plan))
