"""One request's timings from the bytes, with the times given by the test (no clock, no network)."""

from __future__ import annotations

import json

import pytest

from rooflight.agent.proxy import tracker as tr
from rooflight.agent.signals.token_gaps import ClientGaps


def chunk(content: str | None = None, finish: str | None = None, role: bool = False) -> bytes:
    delta: dict = {"role": "assistant", "content": ""} if role else {"content": content}
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode() + b"\n\n"


def usage(prompt: int, completion: int) -> bytes:
    body = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def stream(times_and_bytes: list[tuple[float, bytes]], end: float, start: float = 10.0,
           outcome: str = tr.COMPLETE) -> tr.RequestRecord:
    t = tr.RequestTracker(start, "chat", None)
    t.on_response(200, "text/event-stream; charset=utf-8")
    for at, data in times_and_bytes:
        t.on_bytes(at, data)
    return t.finish(end, outcome)


@pytest.mark.parametrize("method, path, route", [
    ("POST", "/v1/chat/completions", "chat"), ("POST", "/v1/completions", "completions"),
    ("POST", "/openai/v1/chat/completions/", "chat"), ("GET", "/v1/chat/completions", "other"),
    ("POST", "/v1/embeddings", "other"), ("GET", "/metrics", "other"), ("POST", "/v1/completionsx", "other"),
])
def test_routes(method: str, path: str, route: str) -> None:
    assert tr.classify_route(method, path) == route


def test_ttft_is_the_first_content_not_the_role_chunk_and_gaps_are_exact() -> None:
    r = stream([(10.1, chunk(role=True)), (10.25, chunk("a")), (10.30, chunk("b")),
                (10.42, chunk("c", finish="stop") + usage(5, 3)), (10.43, b"data: [DONE]\n\n")], end=10.5)
    assert r.ttft == pytest.approx(0.25)
    assert list(r.itl) == pytest.approx([0.05, 0.12])
    assert (r.output_tokens, r.counted_by, r.prompt_tokens, r.finish_reason) == (3, "usage", 5, "stop")
    assert r.e2e == pytest.approx(0.5)
    assert r.tpot == pytest.approx((0.42 - 0.25) / 2)  # first to last token, as vLLM's bench serve: not to [DONE]


def running(content: str | None, completion: int, role: bool = False, finish: str | None = None) -> bytes:
    """A chunk as vLLM sends it with `stream_options.continuous_usage_stats`: the running token count on each."""
    delta: dict = {"role": "assistant", "content": ""} if role else ({} if content is None else {"content": content})
    body = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            "usage": {"prompt_tokens": 7, "completion_tokens": completion, "total_tokens": 7 + completion}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def test_an_empty_delta_between_tokens_is_a_token_and_its_gap_is_its_own() -> None:
    """A byte-level tokenizer splits a UTF-8 character over tokens; vLLM sends `"content":""` for the ones whose
    text it holds back. They are tokens: skipping them merged their gaps into the next one (ITL 7-12% high)."""
    r = stream([(10.1, chunk(role=True)), (10.2, chunk("")), (10.25, chunk("\u00e9")), (10.3, chunk("")),
                (10.35, chunk("")), (10.4, chunk("b", finish="length"))], end=10.5)
    assert r.ttft == pytest.approx(0.2)  # the first token's text was held back: it is still the first token
    assert list(r.itl) == pytest.approx([0.05, 0.05, 0.05, 0.05])
    assert (r.output_tokens, r.counted_by) == (5, "chunks")


def test_completions_empty_text_is_a_token() -> None:
    t = tr.RequestTracker(10.0, "completions")
    t.on_response(200, "text/event-stream")
    for at, text in ((10.2, "a"), (10.3, ""), (10.4, "b")):
        t.on_bytes(at, b"data: " + json.dumps({"choices": [{"index": 0, "text": text}]}).encode() + b"\n\n")
    r = t.finish(10.5)
    assert list(r.itl) == pytest.approx([0.1, 0.1]) and r.output_tokens == 3


def test_the_running_usage_says_which_chunks_carry_tokens() -> None:
    """With continuous usage stats the count on each chunk decides: the role chunk (0) and a finish-only
    delta that adds nothing are not tokens; an empty delta that adds one is."""
    r = stream([(10.1, running(None, 0, role=True)), (10.2, running("", 1)), (10.3, running("ab", 3)),
                (10.35, running(None, 3, finish="stop")), (10.36, usage(7, 3))], end=10.4)
    assert r.ttft == pytest.approx(0.2)
    assert list(r.itl) == pytest.approx([0.1])
    assert (r.output_tokens, r.counted_by) == (3, "usage")
    assert r.tpot == pytest.approx(0.1 / 2)


def test_token_ids_count_the_tokens_when_there_is_no_usage() -> None:
    t = tr.RequestTracker(10.0, "completions")
    t.on_response(200, "text/event-stream")
    for at, ids in ((10.2, [1]), (10.3, [2, 3, 4])):
        body = {"choices": [{"index": 0, "text": "x", "token_ids": ids}]}
        t.on_bytes(at, b"data: " + json.dumps(body).encode() + b"\n\n")
    r = t.finish(10.5)
    assert (r.output_tokens, r.counted_by, len(r.itl)) == (4, "chunks", 1)  # one gap per chunk, as the client sees


def test_without_usage_the_chunks_are_counted_and_say_so() -> None:
    r = stream([(10.2, chunk("a") + chunk("b")), (10.3, chunk("c", finish="length"))], end=10.3)
    assert (r.output_tokens, r.counted_by, r.prompt_tokens, r.finish_reason) == (3, "chunks", None, "length")
    assert list(r.itl) == pytest.approx([0.0, 0.1])  # two tokens in one read reached the proxy together


def test_usage_wins_over_the_chunk_count() -> None:
    r = stream([(10.2, chunk("ab")), (10.3, chunk("cd", finish="stop")), (10.31, usage(1, 4))], end=10.4)
    assert (r.output_tokens, r.counted_by) == (4, "usage")


def test_one_token_has_no_tpot_and_no_gaps() -> None:
    r = stream([(10.2, chunk("a", finish="stop"))], end=10.25)
    assert r.tpot is None and len(r.itl) == 0 and r.ttft == pytest.approx(0.2)


def test_a_split_line_is_timed_when_it_completes() -> None:
    data = chunk("a")
    r = stream([(10.1, data[:9]), (10.2, data[9:]), (10.3, chunk("b", finish="stop"))], end=10.3)
    assert r.ttft == pytest.approx(0.2)


@pytest.mark.parametrize("finish, label", [("stop", "stop"), ("tool_calls", "tool_calls"), ("eos_weird", "other"),
                                           (None, "unknown")])
def test_finish_reason_labels_are_bounded(finish: str | None, label: str) -> None:
    assert stream([(10.1, chunk("a", finish=finish))], end=10.2).finish_reason == label


def test_outcomes_override_the_finish_reason() -> None:
    assert stream([(10.1, chunk("a"))], end=10.2, outcome=tr.CLIENT_DISCONNECTED).finish_reason == "client_disconnected"
    err = b'data: {"error": {"message": "boom"}}\n\n'
    r = stream([(10.1, chunk("a")), (10.2, err)], end=10.2)
    assert (r.finish_reason, r.ok) == ("upstream_error", True)


def test_non_streamed_json_counts_usage_and_has_no_ttft() -> None:
    t = tr.RequestTracker(1.0, "chat", "k")
    t.on_response(200, "application/json")
    body = json.dumps({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 8, "completion_tokens": 2}}).encode()
    t.on_bytes(1.5, body[:10])
    t.on_bytes(1.6, body[10:])
    r = t.finish(1.7)
    assert (r.stream, r.ttft, r.output_tokens, r.counted_by, r.prompt_tokens, r.finish_reason, r.tenant) == \
        (False, None, 2, "usage", 8, "stop", "k")
    assert r.e2e == pytest.approx(0.7)


def test_a_body_too_large_to_read_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tr, "MAX_BODY_COPY", 16)
    t = tr.RequestTracker(1.0, "completions")
    t.on_response(200, "application/json")
    t.on_bytes(1.1, b'{"usage": {"prompt_tokens": 1, "completion_tokens": 1}}')
    assert t.finish(1.2).output_tokens is None


def test_errors_and_other_routes_are_not_parsed() -> None:
    t = tr.RequestTracker(1.0, "chat")
    t.on_response(503, "text/event-stream")
    t.on_bytes(1.1, chunk("a"))
    r = t.finish(1.2)
    assert (r.status, r.finish_reason, r.ttft, r.ok, r.stream) == (503, "none", None, False, False)
    other = tr.RequestTracker(1.0, "other")
    other.on_response(200, "text/event-stream")
    other.on_bytes(1.1, chunk("a"))
    r = other.finish(1.2)
    assert (r.finish_reason, r.ttft, r.output_tokens) == ("none", None, None)


def test_each_gap_reaches_the_head_of_line_feed_as_its_token_arrives() -> None:
    """Live, before the request ends: a stall mid-stream is judged at the agent's next sample."""
    gaps = ClientGaps()
    t = tr.RequestTracker(10.0, "chat", None, gaps)
    t.on_response(200, "text/event-stream")
    for at, text in ((10.2, "a"), (10.25, "b"), (10.9, "c"), (10.95, "d")):
        t.on_bytes(at, chunk(text))
    assert gaps.worst_between(10.0, 10.5) == pytest.approx(0.05)  # a -> b
    assert gaps.worst_between(10.0, 11.0) == pytest.approx(0.65)  # b -> c, the stall
    assert gaps.worst_between(11.5, 12.0) is None


def test_time_a_slow_client_held_the_proxy_back_is_not_the_engines() -> None:
    """The client feels the whole gap; the head-of-line feed sees only what the upstream took."""
    gaps = ClientGaps()
    t = tr.RequestTracker(10.0, "chat", None, gaps)
    t.on_response(200, "text/event-stream")
    t.on_bytes(10.2, chunk("a"))
    t.on_held(0.6)  # the write of "a" waited 0.6 s for the client's socket
    t.on_bytes(10.85, chunk("b"))
    t.on_held(0.0)
    t.on_bytes(10.9, chunk("c"))
    assert list(t.finish(11.0).itl) == pytest.approx([0.65, 0.05])
    assert gaps.worst_between(10.0, 11.0) == pytest.approx(0.05)


def test_an_endless_stream_keeps_a_bounded_record_of_its_gaps() -> None:
    """Each stream kept every gap (8 bytes a token, forever: a hostile upstream sending endless tiny events
    over 10 streams grew the proxy 45 -> 85 MB in 40 s). Past EXACT_GAPS the gaps are kept as counts per
    0.5%-wide bucket: bounded, and the histogram and percentiles still see every gap, each within 0.5%."""
    t = tr.RequestTracker(10.0, "chat")
    t.on_response(200, "text/event-stream")
    n, clock = 200_000, 10.0
    event = chunk("a")
    for i in range(n):
        clock += 0.01 + 0.04 * (i % 5)  # 10, 50, 90, 130, 170 ms
        t.on_bytes(clock, event)
    gaps = t.finish(clock + 0.01).itl
    assert len(gaps) == n - 1  # every gap counted
    assert len(gaps.exact) <= tr.EXACT_GAPS and len(gaps.folded) <= 10  # five distinct gaps: a few buckets
    assert gaps.held_bytes() < 100_000  # vs 1.6 MB as an array of every gap
    seen = sorted(set(round(g, 4) for g in gaps))
    assert len(seen) <= 10 and all(any(abs(g - want) <= 0.005 * want for g in seen)
                                   for want in (0.01, 0.05, 0.09, 0.13, 0.17))
    assert sum(gaps) == pytest.approx(sum(0.01 + 0.04 * (i % 5) for i in range(1, n)), rel=0.005)


def test_a_hold_excuses_only_the_gap_it_happened_in() -> None:
    """The client held the proxy back 0.5 s once; a later 0.75 s stall with no hold is the engine's whole:
    the head-of-line feed sees 0.75 s, not 0.75 - 0.5."""
    gaps = ClientGaps()
    t = tr.RequestTracker(10.0, "chat", None, gaps)
    t.on_response(200, "text/event-stream")
    t.on_bytes(10.25, chunk("a"))
    t.on_held(0.5)  # the write of "a" waited 0.5 s for the client's socket
    t.on_bytes(10.875, chunk("b"))  # 0.625 s after a: 0.125 s of it the engine's
    t.on_bytes(11.625, chunk("c"))  # 0.75 s after b, the client took every byte at once
    assert gaps.worst_between(10.0, 11.0) == pytest.approx(0.125)
    assert gaps.worst_between(11.0, 12.0) == pytest.approx(0.75)
    assert list(t.finish(12.0).itl) == pytest.approx([0.625, 0.75])  # the client felt both whole


def test_a_total_on_the_last_chunk_alone_is_no_token_of_its_own() -> None:
    """An engine that puts `usage` on its finish chunk only (`delta: {}`, a finish_reason and the request's
    total, no running count before it): the three tokens came in the three content chunks; the finish chunk 0.75 s later is
    no token, so it adds no gap and TPOT stops at the last token: (10.75 - 10.25) / (3 - 1) = 0.25 s."""
    final = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 5, "completion_tokens": 3}}
    r = stream([(10.25, chunk("a")), (10.5, chunk("b")), (10.75, chunk("c")),
                (11.5, b"data: " + json.dumps(final).encode() + b"\n\n")], end=11.5)
    assert (r.output_tokens, r.counted_by, r.finish_reason) == (3, "usage", "stop")
    assert list(r.itl) == [0.25, 0.25]
    assert (r.ttft, r.last_token, r.tpot) == (0.25, 10.75, 0.25)
