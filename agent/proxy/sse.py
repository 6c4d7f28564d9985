"""Server-sent events and OpenAI completion chunks, parsed incrementally and without side effects.

The proxy sees a stream as whatever the socket delivers: an event may arrive in pieces, a line may be
cut between two reads (even between the CR and LF of one line ending), and several events may come in
one read. `SSEParser.feed` keeps the unfinished tail and returns only complete events, following the
WHATWG event-stream rules (CRLF, LF or CR line endings; `data:` lines joined with LF; comments and
unknown fields ignored; an event with no data is not dispatched).
What it holds is bounded: one unfinished line, and the data lines of one unfinished event in total
(`MAX_EVENT_BYTES`), so an upstream that never ends an event cannot grow the proxy; past either bound
`feed` drops what it held and raises SSEError (the caller stops reading that stream). An unfinished line
is kept as the pieces it came in and joined once, when it ends: re-joining it on every read made a long
line in small reads quadratic (4 MiB in 512-byte reads: 4.9 s of CPU, now 13 ms; docs/reliability.md).

`interpret_chunk` reads one OpenAI chunk (`/v1/chat/completions` or `/v1/completions`, vLLM's and
SGLang's extensions included) for what the accounting needs: how many choices carry a token and how many
tokens, a finish reason, and `usage`. `interpret_body` does the same for a non-streamed JSON response.
Both are total: anything unexpected reads as "no output here", never as an exception, and a usage count
is read only from 0 to MAX_USAGE_TOKENS (past it: no usage), so no number the upstream writes can grow
the proxy's counters past what a float holds.

What is a token (docs/proxy.md, section Exactness): a choice's `token_ids` or `logprobs` say how many
tokens it carries where the client asked for them; otherwise a choice whose text field is a string
carries one, *empty included*: vLLM sends `"content":""` (chat) or `"text":""` (completions) for a token
whose text it holds back, e.g. the first bytes of a UTF-8 character split over several tokens (44 of 629
token chunks on the tiny model's byte-level tokenizer). Not tokens: the role announcement (`role` with an
empty text, vLLM's first chat chunk), a delta with no text field (a finish-only chunk), and the
usage-only chunk (`"choices": []`). Where each chunk carries the running count (vLLM's
`continuous_usage_stats`) the tracker goes by that count instead.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

MAX_LINE_BYTES = 4 * 1024 * 1024  # one SSE line longer than this is not a completion chunk
MAX_EVENT_BYTES = 4 * 1024 * 1024  # nor is an event whose data lines (and unfinished line) hold more
DONE = b"[DONE]"
# A usage count above this is not one (ten billion tokens: a thousand choices of a 10M-token context): the
# upstream's number is an arbitrary JSON integer, and one past a float's range (1 and 400 zeros) made every
# snapshot of the proxy's metrics raise OverflowError, /metrics stuck on its last page for good.
MAX_USAGE_TOKENS = 10 ** 10


class SSEError(ValueError):
    """The byte stream is not an event stream the parser can follow (a runaway line or event)."""


class SSEEvent(NamedTuple):  # a tuple, not a dataclass: one is made per token, so its cost counts
    data: bytes  # the joined data lines, without the final LF
    event: bytes = b""  # the `event:` field; empty means "message"


class SSEParser:
    """Feed it bytes as they arrive; it returns the events completed by them, in order."""

    __slots__ = ("_tail", "_tail_size", "_skip_lf", "_data", "_data_size", "_event", "_max_line", "_max_event")

    def __init__(self, max_line: int = MAX_LINE_BYTES, max_event: int = MAX_EVENT_BYTES) -> None:
        self._tail: list[bytes] = []  # an unfinished line, as the pieces it came in
        self._tail_size = 0
        self._skip_lf = False  # the last read ended in CR: an LF opening the next one ends the same line
        self._data: list[bytes] = []
        self._data_size = 0  # bytes in _data, one per joining LF included
        self._event = b""
        self._max_line = max_line
        self._max_event = max_event

    @property
    def buffered(self) -> int:
        """Bytes held between feeds (the unfinished line and event): what the bounds cap."""
        return self._tail_size + self._data_size + len(self._event)

    @property
    def idle(self) -> bool:
        """Between events: nothing held, so a read that is one whole event is that event alone."""
        return not (self._tail or self._data or self._skip_lf or self._event)

    def reset(self) -> None:
        """Forget everything held: the stream is no longer followed."""
        self._tail, self._tail_size, self._skip_lf, self._data, self._data_size, self._event = [], 0, False, [], 0, b""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if (not self._tail and not self._data and not self._skip_lf and chunk[:6] == b"data: "
                and chunk.endswith(b"\n\n") and chunk.count(b"\n") == 2 and b"\r" not in chunk):
            return [SSEEvent(chunk[6:-2])]  # the common read: exactly one single-line data event
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        if not chunk:
            return []
        if self._tail and b"\n" not in chunk and b"\r" not in chunk:
            self._tail.append(chunk)  # the line goes on: keep the piece, copy nothing
            self._tail_size += len(chunk)
            if self._tail_size > self._max_line:
                self.reset()
                raise SSEError(f"an event-stream line longer than {self._max_line} bytes")
            if self.buffered > self._max_event:
                self.reset()
                raise SSEError(f"an event-stream event longer than {self._max_event} bytes")
            return []
        buf = b"".join(self._tail) + chunk if self._tail else chunk  # each piece joined once, as its line ends
        if b"\r" in buf:
            self._skip_lf = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        tail = lines.pop()
        self._tail, self._tail_size = ([tail] if tail else []), len(tail)
        if self._tail_size > self._max_line:
            self.reset()
            raise SSEError(f"an event-stream line longer than {self._max_line} bytes")
        out: list[SSEEvent] = []
        for line in lines:
            event = self._line(line)
            if event is not None:
                out.append(event)
        if self.buffered > self._max_event:
            self.reset()
            raise SSEError(f"an event-stream event longer than {self._max_event} bytes")
        return out

    def data_events(self, chunk: bytes) -> list[bytes] | None:
        """The data of each event in `chunk` where it is whole events of one `data: ` line each and nothing is
        held before it: what `feed` would return, by one split (in C) where feed goes line by line (a read of
        many chunks, from an upstream ahead of the proxy, cost ~3 us of Python an event). None for any other
        read: feed it."""
        if (not chunk.endswith(b"\n\n") or not self.idle or b"\r" in chunk
                or len(chunk) > self._max_line or len(chunk) > self._max_event):
            return None
        parts = chunk.split(b"\n\n")
        parts.pop()  # (what follows the last blank line: nothing)
        for part in parts:
            if part[:6] != b"data: " or b"\n" in part:
                return None  # another field, a comment, a line of its own: the long way
        return [part[6:] for part in parts]

    def _line(self, line: bytes) -> SSEEvent | None:
        if not line:
            return self._dispatch()
        if line[:1] == b":":
            return None  # a comment (keep-alive)
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._data_size += len(value) + 1
            if self._data_size > self._max_event:
                self.reset()
                raise SSEError(f"an event-stream event longer than {self._max_event} bytes")
        elif name == b"event":
            self._event = value
        return None  # id, retry and unknown fields do not matter here

    def _dispatch(self) -> SSEEvent | None:
        data, event = self._data, self._event
        self._data, self._data_size, self._event = [], 0, b""
        if not data:
            return None
        return SSEEvent(data[0] if len(data) == 1 else b"\n".join(data), event)


class ChunkInfo(NamedTuple):
    """What one chunk (or a whole non-streamed body) tells the accounting."""

    outputs: int = 0  # choices in it that carry a token (text, content, reasoning or tool calls; "" included)
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # from `usage`
    completion_tokens: int | None = None  # from `usage`
    error: bool = False  # an `{"error": ...}` object: the engine failed mid-stream
    done: bool = False  # the `[DONE]` sentinel
    tokens: int = 0  # tokens it carries: from token_ids or logprobs where present, else one per output choice
    choices: int = 0  # choice objects in it (the usage-only chunk has none)


NOTHING = ChunkInfo()
DONE_INFO = ChunkInfo(done=True)
ERROR_INFO = ChunkInfo(error=True)
OUTPUT_INFO = tuple(ChunkInfo(n, tokens=n, choices=n) for n in range(4))  # the common chunks, made once
_OUTPUT_KEYS = ("content", "reasoning_content", "reasoning", "text")
_decode = json.JSONDecoder().decode  # json.loads minus its per-call encoding sniffing


def interpret_event(event: SSEEvent) -> ChunkInfo:
    """One SSE event of an OpenAI stream."""
    return interpret_data(event.data)


def interpret_data(data: bytes) -> ChunkInfo:
    """One SSE event's data (its data lines joined) of an OpenAI stream."""
    if data[:1] != b"{":
        data = data.strip()
        if data == DONE:
            return DONE_INFO
        if data[:1] != b"{":
            return NOTHING
    if len(data) > LARGE_JSON_BYTES:
        return scan_large(data, streamed=True)
    try:
        obj = _decode(data.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError included
        return NOTHING
    return interpret_chunk(obj)


# -- the same reading, without decoding: a stream's chunks as one shape ---------------------------------------
#
# A stream's token chunks are the same bytes but for the token's text: `data: {"id":"..","choices":[{..,
# "delta":{"content":"` + TEXT + `"},..}]}` and the blank line. Once a chunk has been decoded, a `ChunkShape`
# keeps the bytes before and after its text and what the chunk told the accounting; a read that is exactly
# those bytes around a valid JSON string body is the same chunk with another string in that one place, and
# the shape was only kept where another non-empty string there reads the same (a finish reason's slot does
# not) and an empty one reads as checked once. Anything else is decoded as before.

# A shape holds its chunk's bytes twice (as a read and as an event's data), outside the accounting's budget: only
# chunks this small have one (vLLM's are 250-400 bytes), so 4,096 streams hold 32 MiB at most.
MAX_SHAPE_BYTES = 4096
_TEXT_SLOT = re.compile(rb'"(?:content|reasoning_content|reasoning|text)"[ \t\r\n]*:[ \t\r\n]*"')
# A JSON string's body (RFC 8259 7): no quote, backslash or control character but in an escape. One character
# a step: with a `+` inside the `*` a body that fails at its end backtracks exponentially (30 bytes: seconds).
_STRING_BODY = re.compile(rb'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*')
_PLAIN = re.compile(rb'[\x20\x21\x23-\x5b\x5d-\x7e]*')  # printable ASCII but the quote and the backslash
_CONTROL = re.compile(rb'[\x00-\x1f]')
_SHORT_TEXT = 256  # a longer text (not a token's) is decoded: the checks below go a character at a time
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)  # whole JSON strings, escapes included


class ChunkShape:
    """One stream's token chunk as bytes around its text, learnt from a decoded chunk (`learn`): `match` reads
    a whole read that is one such event, `match_data` one event's data."""

    __slots__ = ("prefix", "suffix", "data_prefix", "data_suffix", "info", "empty", "least")

    def __init__(self, data_prefix: bytes, data_suffix: bytes, info: ChunkInfo, empty: ChunkInfo) -> None:
        self.data_prefix, self.data_suffix, self.info, self.empty = data_prefix, data_suffix, info, empty
        self.prefix, self.suffix = b"data: " + data_prefix, data_suffix + b"\n\n"  # the event as one read
        self.least = len(data_prefix) + len(data_suffix)

    @classmethod
    def learn(cls, data: bytes, info: ChunkInfo) -> "ChunkShape | None":
        """The shape of an event's `data` that reads as `info`; None where its text's slot cannot be found or
        another text there would read otherwise."""
        if data[:1] != b"{" or len(data) > MAX_SHAPE_BYTES or b"\n" in data or b"\r" in data:
            return None
        slot = None
        for slot in _TEXT_SLOT.finditer(data):
            pass  # the last one: a choice's text comes after the chunk's id and model
        if slot is None:
            return None
        start = slot.end()
        end = _STRING_BODY.match(data, start).end()  # type: ignore[union-attr]
        if end == start or data[end:end + 1] != b'"':
            return None
        before, text, after = data[:start], data[start:end], data[end:]
        if b'"' in _STRINGS.sub(b"", before[:-1]):
            return None  # the slot's quote is inside a string: not a value of its own
        if interpret_data(before + text + b"x" + after) != info:
            return None  # the string there is read for itself (a finish reason): each must be decoded
        return cls(before, after, info, interpret_data(before + after))

    def match(self, read: bytes) -> ChunkInfo | None:
        """What `read` tells the accounting when it is one whole event of this shape (`data: ` to the blank
        line) with another text; None when it is not."""
        prefix, suffix = self.prefix, self.suffix
        if len(read) < self.least + 8 or not read.startswith(prefix) or not read.endswith(suffix):
            return None
        text = read[len(prefix):len(read) - len(suffix)]
        if len(text) <= _SHORT_TEXT and _PLAIN.fullmatch(text) is not None:  # the usual text (once a token)
            return self.info if text else self.empty
        return self._text(text)

    def match_data(self, data: bytes) -> ChunkInfo | None:
        """The same for one event's data (from a read of several events, or of part of one)."""
        prefix, suffix = self.data_prefix, self.data_suffix
        if len(data) < self.least or not data.startswith(prefix) or not data.endswith(suffix):
            return None
        text = data[len(prefix):len(data) - len(suffix)]
        if len(text) <= _SHORT_TEXT and _PLAIN.fullmatch(text) is not None:  # the usual text, as in match
            return self.info if text else self.empty
        return self._text(text)

    def _text(self, text: bytes) -> ChunkInfo | None:
        if not text:
            return self.empty
        if len(text) > _SHORT_TEXT:
            # decoded instead: checking a long text a character at a time cost 5-12x decoding the chunk, and
            # decoding every chunk scans one past LARGE_JSON_BYTES (scan_large), which may read it otherwise
            return None
        if b"\\" in text or b'"' in text:
            if _STRING_BODY.fullmatch(text) is None:
                return None
        elif _CONTROL.search(text) is not None:  # (the usual text: no escape, so only these can be wrong)
            return None
        if not text.isascii():
            try:
                text.decode("utf-8")
            except UnicodeDecodeError:
                return None  # the whole chunk would not decode: decoded, it reads as nothing
        return self.info


def interpret_chunk(obj: Any) -> ChunkInfo:
    """A decoded chunk object: its token-bearing choices and their tokens, last finish reason and usage."""
    if type(obj) is not dict:
        return NOTHING
    choices = obj.get("choices")
    if choices is None and obj.get("error") is not None:
        return ERROR_INFO
    outputs = tokens = seen = 0
    finish = None
    if type(choices) is list:
        for choice in choices:
            if type(choice) is not dict:
                continue
            seen += 1
            n = _tokens(choice)
            if n:
                outputs += 1
                tokens += n
            reason = choice.get("finish_reason")
            if reason and type(reason) is str:
                finish = reason
    usage = obj.get("usage")
    if usage is None:
        if finish is None and outputs == tokens == seen and outputs < len(OUTPUT_INFO):
            return OUTPUT_INFO[outputs]
        return ChunkInfo(outputs, finish, tokens=tokens, choices=seen)
    prompt, completion = _usage(usage)
    return ChunkInfo(outputs, finish, prompt, completion, tokens=tokens, choices=seen)


def interpret_body(body: bytes | bytearray) -> ChunkInfo:
    """A non-streamed completion: the same reading over the whole JSON document."""
    if len(body) > LARGE_JSON_BYTES:
        return scan_large(body, streamed=False)
    try:
        obj = json.loads(body)
    except ValueError:  # UnicodeDecodeError included
        return NOTHING
    return interpret_chunk(obj)


# Decoding JSON holds the event loop (and the GIL) for the whole document: 160-230 ms for a 5.5 MiB answer
# with logprobs, during which every other stream's next token waits and reads as a stall. Past this size
# the accounting scans for the few fields it needs instead (~1 ms per MiB).
LARGE_JSON_BYTES = 256 * 1024
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"([A-Za-z_]{1,32})"')
_FINISH_KEY = re.compile(rb'"finish_reason"\s*:')  # one per choice; a string value is not followed by ':'
_USAGE_FIELD = re.compile(rb'"(prompt_tokens|completion_tokens)"\s*:\s*(\d{1,12})[,}\s]')
_USAGE_SPAN = 4096  # `usage` is a flat object of a few numbers (and small nested details)


def scan_large(data: bytes | bytearray, streamed: bool) -> ChunkInfo:
    """A large chunk or body read by scanning: its last finish reason, its usage, and (streamed) one output
    per choice. Nothing is decoded, so a malformed document gives what its text shows."""
    finishes = [m.group(1) for m in _FINISH.finditer(data)]
    prompt = completion = None
    at = data.rfind(b'"usage"')
    if at >= 0:
        fields = dict(_USAGE_FIELD.findall(data[at:at + _USAGE_SPAN]))
        prompt = _count(int(fields[b"prompt_tokens"])) if b"prompt_tokens" in fields else None
        completion = _count(int(fields[b"completion_tokens"])) if b"completion_tokens" in fields else None
    outputs = max(1, len(_FINISH_KEY.findall(data))) if streamed and b'"choices"' in data else 0
    return ChunkInfo(outputs=outputs, finish_reason=finishes[-1].decode() if finishes else None,
                     prompt_tokens=prompt, completion_tokens=completion, tokens=outputs, choices=outputs)


def _tokens(choice: dict[str, Any]) -> int:
    """Tokens one choice carries: as its token_ids or logprobs count them, else 1 if it carries output."""
    ids = choice.get("token_ids")  # vLLM's return_token_ids
    if type(ids) is list:
        return len(ids)
    logprobs = choice.get("logprobs")
    if type(logprobs) is dict:
        listed = logprobs.get("content")  # chat: one entry per token
        if type(listed) is not list:
            listed = logprobs.get("tokens")  # completions
        if type(listed) is list:
            return len(listed)
    return 1 if _has_output(choice) else 0


def _has_output(choice: dict[str, Any]) -> bool:
    """A text field that is a string (empty included, unless it only comes with the role) or tool calls."""
    delta = choice.get("delta")
    if type(delta) is not dict:
        delta = choice.get("message")
        if type(delta) is not dict:
            delta = choice
    empty = False
    for key in _OUTPUT_KEYS:
        value = delta.get(key)
        if type(value) is str:
            if value:
                return True
            empty = True
    calls = delta.get("tool_calls")
    if type(calls) is list and len(calls) > 0:
        return True
    return empty and "role" not in delta  # the role announcement's "" is no token


def _usage(usage: Any) -> tuple[int | None, int | None]:
    if not isinstance(usage, dict):
        return None, None
    return _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))


def _count(value: Any) -> int | None:
    """A token count as the upstream wrote it, when it can be one: a whole number from 0 to MAX_USAGE_TOKENS."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_USAGE_TOKENS:
        return None
    return value
