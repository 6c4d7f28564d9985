"""One request's timings, from the bytes the proxy relays: pure, so it is tested without a network.

Times are the proxy's monotonic clock. The request starts when the proxy has read its headers; a token
"arrives" when the upstream bytes holding it reach the proxy, so TTFT includes queueing in front of and
inside the engine, and gaps are what the client's socket sees (tokens delivered in one read are 0 s
apart). A token chunk is one that carries a token, an empty delta between tokens included (sse.py says
exactly which): the gaps are one per token chunk after the first, as `vllm bench serve` records its
per-request `itl`. TPOT is vLLM's bench serve definition too: (last token chunk - first) / (output tokens
- 1), undefined for one token or none; it stops at the last token, not at the usage chunk or `[DONE]`.

Output tokens come from the response's `usage` when it has one (`counted_by="usage"`), else from the
token chunks (`counted_by="chunks"`: what each chunk's token_ids or logprobs count, else one per choice
that carries a token, which undercounts where an engine sends several tokens per chunk without saying so,
e.g. under speculative decoding). Where every chunk carries the running count (vLLM's
`continuous_usage_stats`), that count says which chunks carry tokens. Prompt tokens only come from
`usage`: the proxy has no tokenizer.

Memory: what a tracker copies to read an answer (a non-streamed JSON body, up to MAX_BODY_COPY, and its
SSE parser's unfinished event) is reserved in a `ByteBudget` shared by every request; when the budget
is spent, `on_bytes` raises OverBudget and the caller relays the rest of that answer unaccounted.
The gaps between tokens are bounded per stream instead (`TokenGaps`): the first EXACT_GAPS exactly
(64 KiB), the rest as counts in 0.5%-wide buckets (at most ~5,000 of them from 1 us to 1 day, in
practice a few dozen); an endless stream kept 8 bytes a token forever.
"""

from __future__ import annotations

import math
import sys
from array import array
from typing import Iterator
from dataclasses import dataclass, field

from rooflight.agent.proxy import sse
from rooflight.agent.signals.token_gaps import ClientGaps

# Routes the proxy times; anything else passes through and is only counted.
INFERENCE_ROUTES = {"/chat/completions": "chat", "/completions": "completions"}
KNOWN_FINISH = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call", "abort"})
EXACT_GAPS = 8192  # gaps a stream keeps exactly (8 bytes each); the rest are counted per FOLD_ALPHA bucket
FOLD_ALPHA = 0.005  # a folded gap is read back within 0.5% of its value
_FOLD_GAMMA = (1 + FOLD_ALPHA) / (1 - FOLD_ALPHA)
_FOLD_INV_LOG = 1.0 / math.log(_FOLD_GAMMA)
_ZERO_BELOW = 1e-6  # gaps below 1 us are tokens that arrived in one read: 0
MAX_BODY_COPY = 8 * 1024 * 1024  # a non-streamed body larger than this is relayed but not read
MAX_SHAPES = 4  # token chunk shapes a stream learns (each costs two more decodes), then it decodes every chunk

class ByteBudget:
    """Bytes held at once by all requests, for one purpose (request bodies read whole, or the accounting's
    copies of answers): a reservation is taken before the bytes are held, given back when they are not."""

    __slots__ = ("limit", "held", "peak")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0  # the most held at once since start, for tests and debugging

    def take(self, size: int) -> bool:
        """Reserve `size` bytes; False (nothing reserved) when that would pass the limit."""
        if self.held + size > self.limit:
            return False
        self.held += size
        self.peak = max(self.peak, self.held)
        return True

    def give(self, size: int) -> None:
        self.held -= size


class OverBudget(Exception):
    """The accounting's copies of answers held at once reached their budget: this answer goes unaccounted."""


# Outcomes of a request, as the proxy saw it end.
COMPLETE = "complete"
CLIENT_DISCONNECTED = "client_disconnected"
UPSTREAM_ERROR = "upstream_error"  # unreachable, timed out, or broke off mid-response


def classify_route(method: str, path: str) -> str:
    """chat, completions (the OpenAI inference routes, POST) or other (passed through, only counted)."""
    if method != "POST":
        return "other"
    trimmed = path.rstrip("/")
    for suffix, route in INFERENCE_ROUTES.items():
        if trimmed.endswith(suffix) and not (route == "completions" and trimmed.endswith("/chat/completions")):
            return route
    return "other"


class TokenGaps:
    """One stream's gaps between token chunks, in bounded memory: the first EXACT_GAPS as they were,
    then counts per bucket FOLD_ALPHA wide (relative), each read back as its bucket's midpoint. Iterating
    yields every gap (the histograms and percentiles see each one); len() counts them."""

    __slots__ = ("exact", "folded", "zeros", "peak", "_n")

    def __init__(self, gaps: Iterator[float] | tuple[float, ...] = ()) -> None:
        self.exact = array("d")
        self.folded: dict[int, int] = {}
        self.zeros = 0  # folded gaps below 1 us
        self.peak = 0.0  # the longest gap, exactly (the ITL target judges it)
        self._n = 0
        for gap in gaps:
            self.append(gap)

    def append(self, gap: float) -> None:
        self._n += 1
        if gap > self.peak:
            self.peak = gap
        if len(self.exact) < EXACT_GAPS:
            self.exact.append(gap)
        elif gap < _ZERO_BELOW:
            self.zeros += 1
        else:
            i = math.ceil(math.log(gap) * _FOLD_INV_LOG)
            self.folded[i] = self.folded.get(i, 0) + 1

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[float]:
        yield from self.exact
        for _ in range(self.zeros):
            yield 0.0
        for i, count in self.folded.items():
            value = 2 * _FOLD_GAMMA ** i / (_FOLD_GAMMA + 1)
            for _ in range(count):
                yield value

    def held_bytes(self) -> int:
        """What this record holds, roughly: the exact array and the folded buckets."""
        return self.exact.buffer_info()[1] * self.exact.itemsize + sys.getsizeof(self.folded) + 64 * len(self.folded)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """A finished request: everything the exports need, nothing the traffic needs."""

    route: str
    tenant: str | None  # the hashed tenant key, None when the header is absent or not configured
    start: float
    end: float
    status: int | None  # the status the client got; None when no response was started
    outcome: str  # complete, client_disconnected, upstream_error
    stream: bool
    finish_reason: str  # normalised label value (see finish_label)
    ttft: float | None = None
    itl: TokenGaps = field(default_factory=TokenGaps)  # every gap between token chunks, bounded
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    counted_by: str | None = None  # usage or chunks; None when the output was not counted
    upstream_error: str | None = None  # connect, timeout or disconnected (see server.py)
    last_token: float | None = None  # when the last token chunk arrived; None: no token (or not known)

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        """(last token - first token) / (output tokens - 1), as vLLM's bench serve; None for a single
        token, none, or no first token. Without a last token time, the end stands in for it."""
        if self.ttft is None or self.output_tokens is None or self.output_tokens < 2:
            return None
        decoded = (self.end if self.last_token is None else self.last_token) - self.start - self.ttft
        return max(0.0, decoded) / (self.output_tokens - 1)

    @property
    def itl_max(self) -> float | None:
        """The longest gap between token chunks; None when there was no gap (one token chunk or none)."""
        if not len(self.itl):
            return None
        peak = getattr(self.itl, "peak", None)
        return max(self.itl) if peak is None else peak

    @property
    def inference(self) -> bool:
        return self.route != "other"

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300 and self.outcome == COMPLETE


def finish_label(reason: str | None, outcome: str, status: int | None, inference: bool, error: bool) -> str:
    """A bounded finish_reason label: the response's own, or what ended the request instead."""
    if outcome != COMPLETE:
        return outcome
    if not inference or status is None or not 200 <= status < 300:
        return "none"
    if error:
        return UPSTREAM_ERROR
    if reason is None:
        return "unknown"
    return reason if reason in KNOWN_FINISH else "other"


class RequestTracker:
    """Accumulates one request as its response bytes go by; `finish` turns it into a RequestRecord."""

    __slots__ = ("route", "tenant", "start", "status", "stream", "_parser", "_body", "_body_size",
                 "_first", "_last", "_itl", "_tokens", "_running", "_finish", "_prompt", "_completion", "_error",
                 "_gaps", "_held", "_budget", "_reserved", "_shape", "_learnt")

    def __init__(self, start: float, route: str, tenant: str | None = None, gaps: ClientGaps | None = None,
                 budget: ByteBudget | None = None) -> None:
        self.route = route
        self.tenant = tenant
        self.start = start
        self.status: int | None = None
        self.stream = False
        self._parser: sse.SSEParser | None = None
        self._body: bytearray | None = None  # one buffer, read in place at the end: never joined (a 2nd copy)
        self._body_size = 0
        self._first: float | None = None
        self._last: float | None = None
        self._itl = TokenGaps()
        self._tokens = 0  # tokens counted from the chunks (the output count without usage)
        self._running: int | None = None  # the last running completion_tokens a one-choice chunk carried
        self._finish: str | None = None
        self._prompt: int | None = None
        self._completion: int | None = None
        self._error = False
        self._gaps = gaps  # shared by every request: the head-of-line detector reads them live
        self._held = 0.0  # seconds the client's socket held the proxy back since the last token
        self._budget = budget  # shared by every request: the accounting's copies of answers, in total
        self._reserved = 0  # bytes of it this request holds
        self._shape: sse.ChunkShape | None = None  # this stream's token chunk, read without decoding
        self._learnt = 0  # shapes learnt so far (bounded: a stream whose chunks differ is decoded throughout)

    def on_response(self, status: int, content_type: str) -> None:
        """Headers arrived: an event stream is timed per chunk, a JSON body read at the end."""
        self.status = status
        if self.route == "other" or not 200 <= status < 300:
            return
        if content_type.split(";", 1)[0].strip().lower() == "text/event-stream":
            self.stream = True
            self._parser = sse.SSEParser()
        else:
            self._body = bytearray()

    @property
    def reads_bytes(self) -> bool:
        """Whether on_bytes reads anything (an inference route's 2xx answer): the relay skips it otherwise."""
        return self._parser is not None or self._body is not None

    def on_bytes(self, t: float, data: bytes) -> None:
        """Response bytes as they reached the proxy at time t."""
        parser = self._parser
        if parser is not None:
            shape = self._shape
            tried = -1  # the data length `match` has read this read as (checking it twice costs twice)
            if shape is not None and parser.idle:
                info = shape.match(data)
                if info is not None:  # the usual read: one token chunk like the last, nothing held before or after
                    self._account(t, info)
                    return
                tried = len(data) - 8
            events = parser.data_events(data)
            if events is None:
                events = [event.data for event in parser.feed(data)]
            for event in events:
                info = shape.match_data(event) if shape is not None and len(event) != tried else None
                if info is None:
                    info = sse.interpret_data(event)
                    if info.tokens and self._learnt < MAX_SHAPES:
                        self._learnt += 1
                        shape = self._shape = sse.ChunkShape.learn(event, info) or shape
                self._account(t, info)
            buffered = parser.buffered
            if buffered != self._reserved:
                self._hold(buffered)
        elif self._body is not None:
            self._body_size += len(data)
            if self._body_size > MAX_BODY_COPY:
                self.release()  # too large to read: relayed, not counted
            else:
                self._hold(self._body_size)
                self._body += data

    def _account(self, t: float, info: sse.ChunkInfo) -> None:
        """One chunk, arrived at time t."""
        tokens = info.tokens
        if info.completion_tokens is not None and info.choices == 1:
            tokens = self._running_tokens(info)
        if tokens:
            self._output(t, tokens)
        if info.finish_reason is not None or info.prompt_tokens is not None or \
                info.completion_tokens is not None or info.error:
            self._apply(info)

    def _hold(self, size: int) -> None:
        """This request now holds `size` bytes of copies: reserve the difference, or give it back."""
        more = size - self._reserved
        if self._budget is not None:
            if more > 0 and not self._budget.take(more):
                self.release()
                raise OverBudget(f"the accounting's copies of answers held at once reached {self._budget.limit} bytes")
            if more < 0:
                self._budget.give(-more)
        self._reserved = size

    def release(self) -> None:
        """Drop the copies and give their reservation back (the request is finished or no longer read)."""
        self._body = None
        if self._parser is not None:
            self._parser.reset()
        if self._budget is not None and self._reserved:
            self._budget.give(self._reserved)
        self._reserved = 0

    def on_held(self, seconds: float) -> None:
        """The proxy waited `seconds` for the client to take bytes (its socket buffers were full): the next
        gap is longer by that much for the client, but the engine did not cause it, so the head-of-line
        feed does not see it. The client's ITL keeps it: that is what the client felt."""
        self._held += seconds

    def _running_tokens(self, info: sse.ChunkInfo) -> int:
        """Tokens in a one-choice chunk that carries the running count: the count's increase. The first count
        seen decides only when it is 0 (vLLM's role chunk): an engine that puts the total on its last chunk
        alone is read by the chunk itself."""
        count, before = info.completion_tokens, self._running
        self._running = count
        if before is None and count:  # type: ignore[truthy-bool]
            return info.tokens
        return max(0, count - (before or 0))  # type: ignore[operator]

    def _output(self, t: float, tokens: int) -> None:
        if self._first is None:
            self._first = t
        else:
            gap = t - self._last  # type: ignore[operator]
            self._itl.append(gap)
            if self._gaps is not None:
                self._gaps.add(t, max(0.0, gap - self._held))
        self._last = t
        self._held = 0.0
        self._tokens += tokens

    def _apply(self, info: sse.ChunkInfo) -> None:
        if info.finish_reason is not None:
            self._finish = info.finish_reason
        if info.prompt_tokens is not None:
            self._prompt = info.prompt_tokens
        if info.completion_tokens is not None:
            self._completion = info.completion_tokens
        if info.error:
            self._error = True

    def finish(self, t: float, outcome: str = COMPLETE, upstream_error: str | None = None) -> RequestRecord:
        if self._body is not None and outcome == COMPLETE:
            self._apply(sse.interpret_body(self._body))  # no first token before the end: no TTFT
        if self._completion is not None:
            output, counted_by = self._completion, "usage"
        elif self.stream:
            output, counted_by = self._tokens, "chunks"
        else:
            output, counted_by = None, None
        inference = self.route != "other"
        return RequestRecord(
            route=self.route,
            tenant=self.tenant,
            start=self.start,
            end=t,
            status=self.status,
            outcome=outcome,
            stream=self.stream,
            finish_reason=finish_label(self._finish, outcome, self.status, inference, self._error),
            ttft=None if self._first is None else self._first - self.start,
            itl=self._itl,
            prompt_tokens=self._prompt,
            output_tokens=output if inference else None,
            counted_by=counted_by if inference else None,
            upstream_error=upstream_error,
            last_token=self._last,
        )
