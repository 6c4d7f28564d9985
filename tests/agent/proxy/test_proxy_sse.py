"""The SSE and OpenAI chunk parser: incremental, tolerant of any split, total on odd input."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rooflight.agent.proxy import sse

EVENTS = [
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}',
    b'data: {"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}',
    b": keep-alive comment",
    b'event: message\ndata: {"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}',
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}',
    b"data: [DONE]",
]


def _stream(newline: bytes) -> bytes:
    return b"".join(e.replace(b"\n", newline) + newline + newline for e in EVENTS)


def _feed_all(parser: sse.SSEParser, pieces: list[bytes]) -> list[sse.SSEEvent]:
    out: list[sse.SSEEvent] = []
    for piece in pieces:
        out.extend(parser.feed(piece))
    return out


def test_whole_stream_gives_each_data_event_once() -> None:
    events = sse.SSEParser().feed(_stream(b"\n"))
    assert [e.data for e in events] == [e.split(b"data: ", 1)[1] for e in EVENTS if b"data: " in e]
    assert events[2].event == b"message" and events[0].event == b""


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_every_two_piece_split_gives_the_same_events(newline: bytes) -> None:
    data = _stream(newline)
    whole = sse.SSEParser().feed(data)
    for cut in range(len(data) + 1):
        assert _feed_all(sse.SSEParser(), [data[:cut], data[cut:]]) == whole, cut


@settings(max_examples=60, deadline=None)
@given(newline=st.sampled_from([b"\n", b"\r\n", b"\r"]), cuts=st.lists(st.integers(0, 600), max_size=12))
def test_any_split_gives_the_same_events(newline: bytes, cuts: list[int]) -> None:
    data = _stream(newline)
    bounds = sorted({min(c, len(data)) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *bounds], [*bounds, len(data)])]
    assert _feed_all(sse.SSEParser(), pieces) == sse.SSEParser().feed(data)


def test_crlf_cut_between_cr_and_lf_ends_one_line_only() -> None:
    p = sse.SSEParser()
    assert p.feed(b"data: a\r") == []
    assert p.feed(b"\n\r") == [sse.SSEEvent(b"a")]  # the LF belongs to the CR before it; "\r" is the blank line
    assert p.feed(b"\ndata: b\n\n") == [sse.SSEEvent(b"b")]


def test_multi_line_data_is_joined_and_empty_events_are_not_dispatched() -> None:
    p = sse.SSEParser()
    assert p.feed(b"data: one\ndata:two\n\n") == [sse.SSEEvent(b"one\ntwo")]
    assert p.feed(b"event: ping\n\nid: 4\nretry: 10\n\n") == []


def test_a_runaway_line_raises_instead_of_growing() -> None:
    p = sse.SSEParser(max_line=64)
    with pytest.raises(sse.SSEError):
        p.feed(b"data: " + b"x" * 100)
    assert p.feed(b"data: ok\n\n")[-1] == sse.SSEEvent(b"ok")  # the parser is usable afterwards


def test_an_event_that_never_ends_raises_before_its_lines_outgrow_the_bound() -> None:
    p = sse.SSEParser(max_line=64, max_event=1000)
    line = b"data: " + b"x" * 50 + b"\n"  # every line is short; only their number grows
    with pytest.raises(sse.SSEError):
        for _ in range(1000):
            p.feed(line)
            assert p.buffered <= 1000
    assert p.buffered == 0  # what it held is dropped
    with pytest.raises(sse.SSEError):
        p.feed(line * 100)  # many lines in one read: the bound holds within a read too
    assert p.buffered == 0
    assert p.feed(b"data: ok\n\n") == [sse.SSEEvent(b"ok")]


def _info(obj: object) -> sse.ChunkInfo:
    return sse.interpret_event(sse.SSEEvent(json.dumps(obj).encode()))


@pytest.mark.parametrize("delta, outputs", [
    ({"role": "assistant", "content": ""}, 0),  # vLLM's first chunk announces the role: no token
    ({"role": "assistant", "content": "Hi"}, 1),  # an engine that sends the role with the first token
    ({"content": "x"}, 1),
    ({"content": ""}, 1),  # a token whose text is held back (part of a UTF-8 character): still a token
    ({}, 0),  # a finish-only delta
    ({"reasoning_content": ""}, 1),
    ({"reasoning_content": "think"}, 1),
    ({"reasoning": "think"}, 1),
    ({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}, 1),
    ({"tool_calls": []}, 0),
    ({"content": None}, 0),
])
def test_chat_deltas_with_output(delta: dict, outputs: int) -> None:
    assert _info({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}).outputs == outputs


@pytest.mark.parametrize("choice, outputs, tokens", [
    ({"text": ""}, 1, 1),  # /v1/completions: an empty text between tokens is a token
    ({"text": "ab", "token_ids": None}, 1, 1),  # vLLM writes "token_ids": null unless asked for them
    ({"text": " ab", "token_ids": [11, 12]}, 1, 2),  # return_token_ids: the chunk says how many
    ({"text": "", "token_ids": [7]}, 1, 1),
    ({"text": "abc", "logprobs": {"tokens": ["a", "bc"], "token_logprobs": [-1.0, -2.0]}}, 1, 2),
    ({"delta": {"content": "ab"}, "logprobs": {"content": [{"token": "a"}, {"token": "b"}, {"token": ""}]}}, 1, 3),
    ({"delta": {"role": "assistant", "content": ""}, "logprobs": None}, 0, 0),
    ({"delta": {}, "finish_reason": "stop", "token_ids": []}, 0, 0),
])
def test_tokens_per_chunk_from_token_ids_logprobs_or_one_per_choice(choice: dict, outputs: int, tokens: int) -> None:
    info = _info({"choices": [{"index": 0, **choice}]})
    assert (info.outputs, info.tokens, info.choices) == (outputs, tokens, 1)


def test_completions_text_finish_reason_and_usage() -> None:
    info = _info({"choices": [{"index": 0, "text": "a", "finish_reason": "length"},
                              {"index": 1, "text": "b", "finish_reason": None}],
                  "usage": {"prompt_tokens": 11, "completion_tokens": 4}})
    assert (info.outputs, info.finish_reason, info.prompt_tokens, info.completion_tokens) == (2, "length", 11, 4)


@pytest.mark.parametrize("data", [b"not json", b"[1,2]", b'"text"', b"\xff\xfe", b'{"choices": "x", "usage": 3}',
                                  b'{"usage": {"prompt_tokens": true, "completion_tokens": -1}}'])
def test_odd_chunks_read_as_nothing(data: bytes) -> None:
    info = sse.interpret_event(sse.SSEEvent(data))
    assert (info.outputs, info.finish_reason, info.prompt_tokens, info.completion_tokens, info.error) == \
        (0, None, None, None, False)


def test_done_and_error_events() -> None:
    assert sse.interpret_event(sse.SSEEvent(b"[DONE]")).done
    assert _info({"error": {"message": "engine died", "code": 500}}).error


def test_non_streamed_bodies() -> None:
    chat = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2}}
    info = sse.interpret_body(json.dumps(chat).encode())
    assert (info.outputs, info.finish_reason, info.prompt_tokens, info.completion_tokens) == (1, "stop", 9, 2)
    assert sse.interpret_body(b"<html>oops</html>") == sse.NOTHING


def _large_answer(finish: str, prompt: int, completion: int, chat: bool = True) -> dict:
    """An answer past LARGE_JSON_BYTES: logprobs with their top alternatives, as `logprobs: true` returns."""
    entries = [{"token": f"t{i}", "logprob": -0.5, "top_logprobs": [{"token": "usage", "logprob": -2.0}] * 5}
               for i in range(3000)]
    body = {"index": 0, "logprobs": {"content": entries}, "finish_reason": finish}
    body.update({"message": {"role": "assistant", "content": "finish_reason"}} if chat else {"text": "x"})
    return {"id": "c", "choices": [body], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                                     "total_tokens": prompt + completion}}


@pytest.mark.parametrize("chat", [True, False])
def test_a_large_answer_is_scanned_to_what_decoding_it_gives(chat: bool) -> None:
    data = json.dumps(_large_answer("length", 123, 3000, chat)).encode()
    assert len(data) > sse.LARGE_JSON_BYTES
    decoded = sse.interpret_chunk(json.loads(data))
    scanned = sse.interpret_body(data)
    assert (scanned.finish_reason, scanned.prompt_tokens, scanned.completion_tokens) == (
        decoded.finish_reason, decoded.prompt_tokens, decoded.completion_tokens) == ("length", 123, 3000)
    event = sse.interpret_event(sse.SSEEvent(data=data))
    assert event.outputs == decoded.outputs == 1 and event.finish_reason == "length"


# -- cost: linear in the bytes fed, however they are cut ---------------------------------------------------


def _cpu_to_feed(pieces: list[bytes]) -> tuple[float, int]:
    """CPU seconds (this thread's) to feed `pieces` to a fresh parser, and the events it gave."""
    import time

    parser = sse.SSEParser()
    start = time.thread_time()
    events = 0
    for piece in pieces:
        events += len(parser.feed(piece))
    return time.thread_time() - start, events


def _cut(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def test_a_long_line_in_small_reads_costs_no_more_than_short_lines_in_the_same_reads() -> None:
    """A line cut into many reads is kept as its pieces, not re-copied on every read: 2 MiB in 512-byte
    reads cost 1 GiB of copying when each read re-joined the unfinished line (quadratic)."""
    size, read = 2 * 1024 * 1024, 512
    long_line = b"data: " + b"x" * (size - 8) + b"\n\n"
    short = b"data: " + b"y" * 120 + b"\n\n"
    short_lines = short * (size // len(short))
    _cpu_to_feed(_cut(short_lines, read))  # warm up
    baseline, short_events = min(_cpu_to_feed(_cut(short_lines, read)) for _ in range(3))
    cost, long_events = min(_cpu_to_feed(_cut(long_line, read)) for _ in range(3))
    assert (short_events, long_events) == (size // len(short), 1)
    # Linear: the long line is no dearer than the short lines (it makes fewer events); quadratic was 30x+.
    assert cost <= 5 * baseline + 0.005, (cost, baseline)


_LINES = [b"data: {\"a\":1}", b"data: ", b"data:  spaced", b"data:x", b": ping", b"event: e", b"id: 3",
          b"data: [DONE]", b"", b"data: two\ndata: lines", b"data: \xff\xfe"]


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.sampled_from(_LINES), max_size=12), newline=st.sampled_from([b"\n", b"\r\n"]),
       cut=st.integers(0, 400), held=st.booleans())
def test_data_events_is_feed_where_it_reads_at_all(lines: list[bytes], newline: bytes, cut: int, held: bool) -> None:
    """The tracker reads a read of whole one-line data events by data_events (a split in C) and anything else
    by feed: where data_events reads one, it must say what feed says, from any state feed may be in."""
    data = b"".join(line + newline + newline for line in lines)
    first, second = (data[:cut], data[cut:]) if held else (b"", data)
    fast, slow = sse.SSEParser(), sse.SSEParser()
    fast.feed(first)
    slow.feed(first)
    got = fast.data_events(second)
    if got is not None:
        assert got == [e.data for e in slow.feed(second)]
        assert fast.idle and slow.idle
