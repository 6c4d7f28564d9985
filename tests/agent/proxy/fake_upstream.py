"""A scripted OpenAI-compatible upstream over real HTTP on 127.0.0.1, with known latencies.

A request's JSON `model` names its script (`FakeUpstream.scripts`); the server sleeps the script's TTFT,
then sends one SSE event per token with the script's gaps, optionally usage and `[DONE]`. Every request is
recorded (method, path, headers, body), and so is every stream the server saw cancelled (its client went
away), so tests can check what reached the upstream and that a disconnect reached it.
Also here: /echo (what the server received), /status/{code} (an error with a body and a header) and a
stream that breaks off mid-way.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from support import serve_app


@dataclass(frozen=True)
class Script:
    ttft: float = 0.0  # seconds before the first token
    gaps: tuple[float, ...] = ()  # seconds before each later token
    usage: bool = True  # send a final usage chunk (stream_options.include_usage)
    prompt_tokens: int = 7
    finish: str = "stop"
    split_writes: bool = False  # write each event in two pieces cut mid-line
    break_after: int | None = None  # close the connection after this many tokens (no [DONE])
    chat: bool = True
    pad: int = 0  # bytes of filler added to each token's text (large events fill a slow client's buffers)
    logprobs: int = 0  # a non-streamed answer carries this many logprob entries (many small objects)

    @property
    def tokens(self) -> int:
        return 1 + len(self.gaps)


@dataclass
class Seen:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes
    peer: object = None  # the client's (host, port): one per connection


@dataclass
class FakeUpstream:
    scripts: dict[str, Script] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)  # models whose stream saw its client leave
    finished: list[str] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None
    _cancel_event: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_get("/v1/models", self._models)
        app.router.add_route("*", "/echo", self._echo)
        app.router.add_route("*", "/status/{code}", self._status)
        self._runner, self.url = await serve_app(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def wait_cancelled(self, timeout: float) -> None:
        await asyncio.wait_for(self._cancel_event.wait(), timeout)

    def _record(self, request: web.Request, body: bytes) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.seen.append(Seen(request.method, request.raw_path, list(request.headers.items()), body, peer))

    async def _models(self, request: web.Request) -> web.Response:
        self._record(request, b"")
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def _echo(self, request: web.Request) -> web.Response:
        body = await request.read()
        self._record(request, body)
        return web.json_response({"sha256": hashlib.sha256(body).hexdigest(), "length": len(body),
                                  "headers": [[k, v] for k, v in request.headers.items() if k.lower() != "host"],
                                  "query": request.query_string})

    async def _status(self, request: web.Request) -> web.Response:
        body = await request.read()
        self._record(request, body)
        code = int(request.match_info["code"])
        payload = {"error": {"message": f"scripted {code}", "type": "fake", "code": code}}
        return web.Response(status=code, body=json.dumps(payload).encode(), content_type="application/json",
                            headers={"X-Fake-Error": str(code), "Retry-After": "3"})

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self._record(request, body)
        req = json.loads(body)
        model = str(req.get("model", "default"))
        script = self.scripts.get(model, Script())
        if not req.get("stream"):
            return await self._whole(model, script)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                               "Cache-Control": "no-cache", "X-Fake-Model": model})
        await response.prepare(request)
        try:
            await asyncio.sleep(script.ttft)
            for i in range(script.tokens):
                if i:
                    await asyncio.sleep(script.gaps[i - 1])
                if script.break_after is not None and i >= script.break_after:
                    request.transport.close()  # type: ignore[union-attr]
                    return response
                last = i == script.tokens - 1
                await self._write(response, event(model, i, script, last), script.split_writes)
            if script.usage:
                await self._write(response, usage_event(model, script), script.split_writes)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            self.cancelled.append(model)
            self._cancel_event.set()
            raise
        self.finished.append(model)
        return response

    async def _whole(self, model: str, script: Script) -> web.Response:
        await asyncio.sleep(script.ttft + sum(script.gaps))
        return web.Response(body=whole_body(model, script), content_type="application/json")

    @staticmethod
    async def _write(response: web.StreamResponse, data: bytes, split: bool) -> None:
        if split:
            cut = len(data) // 2
            await response.write(data[:cut])
            await asyncio.sleep(0.002)
            await response.write(data[cut:])
        else:
            await response.write(data)


def token_text(i: int, pad: int = 0) -> str:
    return f"tok{i} " + "x" * pad


def event(model: str, i: int, script: Script, last: bool) -> bytes:
    finish = script.finish if last else None
    if script.chat:
        choice = {"index": 0, "delta": {"content": token_text(i, script.pad)}, "logprobs": None, "finish_reason": finish}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": token_text(i, script.pad), "logprobs": None, "finish_reason": finish}
        kind = "text_completion"
    chunk = {"id": "cmpl-fake", "object": kind, "created": 1, "model": model, "choices": [choice]}
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def usage_event(model: str, script: Script) -> bytes:
    chunk = {"id": "cmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": [],
             "usage": {"prompt_tokens": script.prompt_tokens, "completion_tokens": script.tokens,
                       "total_tokens": script.prompt_tokens + script.tokens}}
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

@functools.lru_cache(maxsize=8)
def whole_body(model: str, script: Script) -> bytes:
    """A non-streamed answer, encoded once per script: a test timing the proxy must not time this."""
    text = "".join(token_text(i, script.pad) for i in range(script.tokens))
    message = {"role": "assistant", "content": text} if script.chat else None
    logprobs = {"content": [{"token": f"t{i}", "logprob": -0.5, "top_logprobs": [{"token": "u", "logprob": -2.0}] * 5}
                            for i in range(script.logprobs)]} if script.logprobs else None
    choice: dict[str, Any] = {"index": 0, "finish_reason": script.finish, "logprobs": logprobs}
    choice.update({"message": message} if script.chat else {"text": text})
    payload = {"id": "cmpl-fake", "object": "chat.completion", "model": model, "choices": [choice],
               "usage": {"prompt_tokens": script.prompt_tokens, "completion_tokens": script.tokens,
                         "total_tokens": script.prompt_tokens + script.tokens}}
    return json.dumps(payload).encode()
