"""ClientGaps: the worst client-seen gap over a span, to its 100 ms slots, with bounded memory."""

from __future__ import annotations

import pytest

from rooflight.agent.signals.token_gaps import ClientGaps


def test_the_worst_gap_of_a_span_and_none_where_no_token_arrived() -> None:
    gaps = ClientGaps()
    for t, gap in ((100.05, 0.004), (100.31, 0.060), (100.52, 0.005), (101.43, 0.007)):
        gaps.add(t, gap)
    assert gaps.worst_between(100.0, 101.5) == pytest.approx(0.060)
    assert gaps.worst_between(100.4, 101.5) == pytest.approx(0.007)  # the stall's slot is before the span
    assert gaps.worst_between(100.4, 100.6) == pytest.approx(0.005)
    assert gaps.worst_between(101.5, 102.0) is None
    assert gaps.worst_between(99.0, 99.9) is None


def test_the_open_slot_counts_and_a_zero_gap_is_a_token_that_arrived() -> None:
    gaps = ClientGaps()
    gaps.add(5.01, 0.0)  # tokens delivered in one read are 0 s apart
    assert gaps.worst_between(4.9, 5.05) == 0.0
    gaps.add(5.02, 0.003)
    assert gaps.worst_between(4.9, 5.05) == pytest.approx(0.003)


def test_slots_older_than_keep_seconds_are_dropped() -> None:
    gaps = ClientGaps(keep_seconds=2.0)
    for i in range(100):  # 10 s of one gap per slot
        gaps.add(i / 10 + 0.01, 0.001 * (i + 1))
    assert len(gaps._closed) <= 21
    assert gaps.worst_between(0.0, 5.0) is None  # forgotten
    assert gaps.worst_between(9.0, 10.0) == pytest.approx(0.100)


def test_a_stall_is_the_worst_gap_less_what_the_proxys_own_loop_added() -> None:
    gaps = ClientGaps()
    gaps.add(10.05, 0.004)
    gaps.add(10.31, 0.260)  # every stream waited while the loop was busy for 0.25 s ...
    gaps.loop_lag.add(10.30, 0.250)  # ... which the loop's probe saw
    assert gaps.worst_between(10.0, 10.5) == pytest.approx(0.260)
    assert gaps.stall_between(10.0, 10.5) == pytest.approx(0.010)
    gaps.add(11.2, 0.090)  # a stall with the loop on time
    assert gaps.stall_between(11.0, 11.5) == pytest.approx(0.090)
    gaps.loop_lag.add(12.1, 0.5)
    assert gaps.stall_between(12.0, 12.5) is None  # no token: nothing to judge
    gaps.add(12.2, 0.1)
    assert gaps.stall_between(12.0, 12.5) == 0.0  # never below 0


def test_gaps_added_from_one_thread_are_read_from_another() -> None:
    """The proxy adds from its own thread (`rooflight run --proxy-listen`) while the sampler reads."""
    import sys
    import threading

    gaps = ClientGaps(keep_seconds=1.0, slots_per_second=1000)  # a slot per ms: the deque changes all the time
    stop = threading.Event()

    def proxy() -> None:
        t = 0.0
        while not stop.is_set():
            t += 0.0005
            gaps.add(t, 0.01)

    errors: list[BaseException] = []
    writer = threading.Thread(target=proxy)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    writer.start()
    try:
        for _ in range(3000):
            try:
                gaps.stall_between(0.0, 1e9)
            except RuntimeError as exc:  # deque mutated during iteration
                errors.append(exc)
                break
    finally:
        stop.set()
        writer.join()
        sys.setswitchinterval(interval)
    assert errors == []


def test_slots_travel_to_another_process_copy_whole() -> None:
    """A relay in a process of its own (rooflight run --proxy-listen) sends its slots as they are (slots_since,
    the open one again each time: it may grow); the agent's copy merges them to the same worsts."""
    relay, copy = ClientGaps(), ClientGaps()
    sent_from = -1
    for t, gap in ((0.05, 0.004), (0.12, 0.006), (0.13, 0.060), (0.31, 0.005), (0.35, 0.007), (1.02, 0.003)):
        relay.add(t, gap)
        if t in (0.13, 0.35, 1.02):  # a flush now and then, as a worker's
            copy.merge(relay.slots_since(sent_from))
            sent_from = relay.open_slot
    for start, end in ((0.0, 0.09), (0.1, 0.19), (0.0, 0.5), (0.3, 0.39), (1.0, 1.09), (0.0, 2.0), (0.5, 0.9)):
        assert copy.worst_between(start, end) == relay.worst_between(start, end), (start, end)
    copy.merge([(2, 0.5)])  # a late slot (an older process's) takes its place in order, and keeps the larger worst
    copy.merge([(1, 0.001)])
    assert copy.worst_between(0.2, 0.29) == 0.5 and copy.worst_between(0.1, 0.19) == 0.060
    copy.merge([(10_000, 0.001)])  # a slot 1,000 s on: everything older than keep_seconds is forgotten
    assert copy.worst_between(0.0, 2.0) is None
