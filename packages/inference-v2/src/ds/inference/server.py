"""OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions, /v1/models, /health,
/metrics.

Requests are validated in full (:mod:`ds.inference.protocol`) before anything is queued; one
background thread owns the engine (:mod:`ds.inference.engine_loop`) and delivers each sequence's
tokens through an asyncio queue. A client that goes away, streaming or not, is aborted before the
next engine step. Every error is OpenAI's error object (:mod:`ds.inference.openai_errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ds.inference.engine import InferenceEngineV2
from ds.inference.engine_loop import EngineLoop, ErrorEvent, Event, LogProb, TokenEvent
from ds.inference.metrics import ServerMetrics
from ds.inference.openai_errors import APIError, install_handlers
from ds.inference.protocol import Limits, ParsedRequest, load_body, parse
from ds.inference.tokenizer import TextCodec
from ds.inference.tools import ToolCallParser
from ds.interfaces.logging import get_logger

__all__ = ["EngineLoop", "create_app"]

log = get_logger(__name__)


# (token, its logprob, top alternatives); logprob and alternatives are None for the first
# prompt token of an echo, which nothing before it scores
_Entry = tuple[int, float | None, list[tuple[int, float]] | None]


@dataclass
class _Choice:
    index: int
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[_Entry] = field(default_factory=list)
    cached: int = 0
    prompt_logprobs: list[LogProb] | None = None  # echo + logprobs: prompt tokens 1.. scored
    echo_length: int = 0  # text offset where generated tokens start (streamed echo + logprobs)
    parser: ToolCallParser | None = None  # streamed tool calls


def _grammar_factory(engine: InferenceEngineV2, codec: TextCodec) -> Any:
    from ds.inference import grammar

    if not grammar.available() or codec.path is None:
        return None
    return grammar.LazyCompiler(codec.path, engine.model.vocab_size, engine.eos_token_ids)


class _BearerAuth:
    """``Authorization: Bearer KEY`` on /v1 routes. Plain ASGI, not BaseHTTPMiddleware: that one
    hides the client's disconnect from handlers, and abandoned requests would run on."""

    def __init__(self, app: Any, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope.get("headers") or ()).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                err = APIError(401, "Incorrect API key provided", code="invalid_api_key")
                await JSONResponse(err.body(), status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    engine: InferenceEngineV2,
    codec: TextCodec,
    model_name: str,
    api_key: str | None = None,
    on_death: Callable[[], None] | None = None,
    max_prompt_chars: int | None = None,
) -> Any:
    metrics = ServerMetrics(model_name)

    def died() -> None:
        # Stop the HTTP server (cli.serve installs stop_server) so the process exits non-zero.
        if on_death is not None:
            on_death()
        stop = getattr(app.state, "stop_server", None)
        if stop is not None:
            stop()

    loop_ = EngineLoop(engine, codec, metrics, died)
    cap = engine.capacity()
    limits = Limits(
        model_name,
        engine.max_context,
        cap.total_blocks * cap.block_size,
        engine.model.vocab_size,
        max_prompt_chars,
    )
    grammar = _grammar_factory(engine, codec)
    ids = itertools.count()

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        yield
        loop_.close()

    app = FastAPI(title="ds serve", lifespan=lifespan)
    app.state.engine_loop = loop_
    app.state.metrics = metrics
    install_handlers(app)

    if api_key:
        app.add_middleware(_BearerAuth, key=api_key)

    # -- helpers ------------------------------------------------------------------------------
    async def body_of(request: Request) -> Any:
        return load_body(await request.body())

    def logprobs_json(chat: bool, entries: list[_Entry], offset: int) -> Any:
        if chat:
            content = []
            for tok, lp, top in entries:
                text = codec.token_text(tok)
                content.append(
                    {
                        "token": text,
                        "logprob": lp,
                        "bytes": list(text.encode()),
                        "top_logprobs": [
                            {
                                "token": codec.token_text(t),
                                "logprob": v,
                                "bytes": list(codec.token_text(t).encode()),
                            }
                            for t, v in top or ()
                        ],
                    }
                )
            return {"content": content}
        texts = [codec.token_text(tok) for tok, _, _ in entries]
        offsets = []
        for t in texts:
            offsets.append(offset)
            offset += len(t)
        return {
            "tokens": texts,
            "token_logprobs": [lp for _, lp, _ in entries],
            # The first prompt token has no logprob and no alternatives (null), as in OpenAI's.
            "top_logprobs": [
                None
                if lp is None
                else {codec.token_text(tok): lp, **{codec.token_text(t): v for t, v in top or ()}}
                for tok, lp, top in entries
            ],
            "text_offset": offsets,
        }

    def prompt_entries(req: ParsedRequest, c: _Choice) -> list[_Entry]:
        """The echoed prompt's logprob entries: its first token unscored, the rest scored."""
        prompt = req.prompts[req.prompt_of(c.index)]
        first: _Entry = (prompt[0], None, None)
        scored = c.prompt_logprobs or ()
        return [first] + [(t, lp, top) for t, (lp, top) in zip(prompt[1:], scored)]

    def text_length(entries: list[_Entry]) -> int:
        return sum(len(codec.token_text(tok)) for tok, _, _ in entries)

    def usage(req: ParsedRequest, choices: list[_Choice]) -> dict[str, Any]:
        done = sum(len(c.tokens) for c in choices)
        cached = sum(
            max(c.cached for c in choices[p * req.n : (p + 1) * req.n])
            for p in range(len(req.prompts))
        )
        prompt = sum(len(p) for p in req.prompts)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": done,
            "total_tokens": prompt + done,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def prompt_text(req: ParsedRequest, index: int) -> str:
        p = req.prompt_of(index)
        text = req.prompt_texts[p]
        return text if text is not None else codec.decode(req.prompts[p])

    def start(req: ParsedRequest) -> tuple[list[int], asyncio.Queue[tuple[int, Event]]]:
        aloop = asyncio.get_running_loop()
        q: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

        def deliver_to(i: int) -> Callable[[Event], None]:
            return lambda ev: aloop.call_soon_threadsafe(q.put_nowait, (i, ev))

        uids: list[int] = []
        for p, prompt in enumerate(req.prompts):  # n choices of a prompt share its blocks
            own = range(p * req.n, (p + 1) * req.n)
            uids += loop_.submit(
                prompt, req.params[own[0] : own[-1] + 1], [deliver_to(i) for i in own]
            )
        return uids, q

    def apply(c: _Choice, ev: TokenEvent) -> None:
        c.text += ev.text
        c.finish_reason = ev.finish_reason
        c.cached = ev.cached_tokens
        if ev.prompt_logprobs is not None:
            c.prompt_logprobs = ev.prompt_logprobs
        if ev.token is None:
            return
        c.tokens.append(ev.token)
        if ev.logprob is not None:
            c.logprobs.append((ev.token, ev.logprob[0], ev.logprob[1]))

    def tool_message(c: _Choice, text: str) -> dict[str, Any]:
        """The assistant message of a choice that may call tools: content and tool_calls."""
        parser = ToolCallParser()
        parser.feed(text)
        parser.finish(cut=c.finish_reason == "length")
        if not parser.calls:  # a call cut off by max_tokens, and no text: content null
            content = parser.content or (None if parser.dropped else "")
            return {"role": "assistant", "content": content}
        if c.finish_reason == "stop":  # cut off by max_tokens stays "length"
            c.finish_reason = "tool_calls"
        return {
            "role": "assistant",
            "content": parser.content or None,
            "tool_calls": [call.json() for call in parser.calls],
        }

    def tool_delta(c: _Choice, ev: TokenEvent, item: dict[str, Any]) -> dict[str, Any]:
        """A streamed delta of a choice that may call tools: released content, completed calls
        (each whole, with its id, as one ``tool_calls`` entry), finish_reason tool_calls."""
        if c.parser is None:
            c.parser = ToolCallParser()
        text, calls = c.parser.feed(ev.text)
        if ev.finish_reason is not None:
            text += c.parser.finish(cut=ev.finish_reason == "length")
            if c.parser.calls and ev.finish_reason == "stop":
                item["finish_reason"] = "tool_calls"
        delta: dict[str, Any] = {"content": text} if text else {}
        first = len(c.parser.calls) - len(calls)
        if calls:
            delta["tool_calls"] = [call.json(first + k) for k, call in enumerate(calls)]
        return delta

    # -- completion handling ------------------------------------------------------------------
    async def complete(request: Request, chat: bool) -> Any:
        if not loop_.alive:
            raise APIError(503, f"the engine is not running: {loop_.dead}")
        body = await body_of(request)
        req = await asyncio.to_thread(parse, body, chat, codec, limits, grammar)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{next(ids)}"
        created = int(time.time())
        if req.stream:
            uids, q = start(req)
            return StreamingResponse(
                stream(req, rid, created, uids, q), media_type="text/event-stream"
            )
        return await unary(request, req, rid, created)

    async def unary(request: Request, req: ParsedRequest, rid: str, created: int) -> Any:
        uids, q = start(req)
        choices = [_Choice(i) for i in range(len(uids))]
        left = set(range(len(uids)))

        async def collect() -> ErrorEvent | None:
            while left:
                i, ev = await q.get()
                if isinstance(ev, ErrorEvent):
                    return ev
                apply(choices[i], ev)
                if ev.finish_reason is not None:
                    left.discard(i)
            return None

        async def disconnected() -> None:
            # The body is read, so the next ASGI message is the client's disconnect: waiting
            # for it costs nothing, unlike polling.
            while (await request.receive())["type"] != "http.disconnect":
                pass

        task = asyncio.ensure_future(collect())
        watch = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                task.cancel()
                return Response(status_code=499)  # the client is gone; nobody reads this
            error = task.result()
        finally:
            watch.cancel()
            for i in left:
                loop_.abort(uids[i])
        if error is not None:
            raise APIError(error.status, error.message)
        out = []
        for c in choices:
            text = c.text
            if req.echo:
                text = prompt_text(req, c.index) + text
            item: dict[str, Any] = {
                "index": c.index,
                "finish_reason": c.finish_reason,
                "token_ids": c.tokens,
            }
            lp = None
            if req.logprobs is not None:
                entries = c.logprobs
                if req.echo:  # the echoed prompt's entries first, offsets over the whole text
                    entries = prompt_entries(req, c) + entries
                lp = logprobs_json(req.chat, entries, 0)
            if req.chat:
                item["message"] = {"role": "assistant", "content": text}
                if req.tools is not None:
                    item["message"] = tool_message(c, text)
                    item["finish_reason"] = c.finish_reason
                item["logprobs"] = lp
            else:
                item["text"] = text
                item["logprobs"] = lp
            out.append(item)
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion" if req.chat else "text_completion",
                "created": created,
                "model": model_name,
                "choices": out,
                "usage": usage(req, choices),
            }
        )

    async def stream(
        req: ParsedRequest,
        rid: str,
        created: int,
        uids: list[int],
        q: asyncio.Queue[tuple[int, Event]],
    ) -> AsyncIterator[str]:
        obj = "chat.completion.chunk" if req.chat else "text_completion"
        choices = [_Choice(i) for i in range(len(uids))]
        left = set(range(len(uids)))

        def chunk(items: list[dict[str, Any]], use: dict[str, Any] | None = None) -> str:
            data: dict[str, Any] = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model_name,
                "choices": items,
            }
            if req.include_usage:
                data["usage"] = use
            return "data: " + json.dumps(data) + "\n\n"

        try:
            if req.chat:
                yield chunk(
                    [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                        for i in range(len(uids))
                    ]
                )
            elif req.echo and req.logprobs is None:
                yield chunk(
                    [
                        {
                            "index": i,
                            "text": prompt_text(req, i),
                            "logprobs": None,
                            "finish_reason": None,
                            "token_ids": [],
                        }
                        for i in range(len(uids))
                    ]
                )
            while left:
                i, ev = await q.get()
                if isinstance(ev, ErrorEvent):
                    err = APIError(ev.status, ev.message)
                    yield "data: " + json.dumps(err.body()) + "\n\n"
                    break
                c = choices[i]
                before = len(c.logprobs)
                apply(c, ev)
                if ev.prompt_logprobs is not None and req.echo:
                    # The echo waits for the prompt's scores, which come with the first event.
                    entries = prompt_entries(req, c)
                    c.echo_length = text_length(entries)
                    yield chunk(
                        [
                            {
                                "index": i,
                                "text": prompt_text(req, i),
                                "logprobs": logprobs_json(False, entries, 0),
                                "finish_reason": None,
                                "token_ids": [],
                            }
                        ]
                    )
                lp = None
                if req.logprobs is not None:
                    base = c.echo_length + len(c.text) - len(ev.text)
                    lp = logprobs_json(req.chat, c.logprobs[before:], base)
                item: dict[str, Any] = {"index": i, "finish_reason": ev.finish_reason}
                if req.chat and req.tools is not None:
                    item["delta"] = tool_delta(c, ev, item)
                elif req.chat:
                    item["delta"] = {"content": ev.text}
                else:
                    item["text"] = ev.text
                item["logprobs"] = lp
                item["token_ids"] = [] if ev.token is None else [ev.token]
                if ev.finish_reason is not None:
                    left.discard(i)
                elif req.chat and not item["delta"] and lp is None:
                    continue  # inside a tool call: nothing to say yet
                yield chunk([item])
            else:
                if req.include_usage:
                    yield chunk([], usage(req, choices))
            yield "data: [DONE]\n\n"
        finally:
            for i in left:  # the client went away, or a choice failed: stop the rest
                loop_.abort(uids[i])

    # -- routes -------------------------------------------------------------------------------
    @app.get("/health")
    def health() -> Any:
        c = engine.capacity()
        body = {
            "status": "ok" if loop_.alive else "dead",
            "free_blocks": c.free_blocks,
            "total_blocks": c.total_blocks,
        }
        if not loop_.alive:
            body["error"] = loop_.dead or "the engine thread stopped"
            return JSONResponse(body, status_code=503)
        return body

    @app.get("/metrics")
    def metrics_() -> Any:
        content, media = metrics.render()
        return Response(content, media_type=media)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "ds",
                    "max_model_len": engine.max_context,
                }
            ],
        }

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await complete(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await complete(request, chat=True)

    return app
