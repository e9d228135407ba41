"""OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions (streaming or not).

One background thread owns the engine and runs the continuous-batching scheduler; HTTP handlers
submit requests to it and receive tokens through asyncio queues as they are produced.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ds.inference.engine import InferenceEngineV2
from ds.inference.scheduler import ContinuousBatchScheduler
from ds.inference.tokenizer import TextCodec
from ds.interfaces.errors import DsError
from ds.interfaces.inference import SamplingParams
from ds.interfaces.logging import get_logger

log = get_logger(__name__)

# Events delivered to a request's consumer: ("token", id, finished) or ("error", message).
Event = tuple[Any, ...]


@dataclass
class _Submission:
    uid: int
    prompt: list[int]
    params: SamplingParams
    deliver: Callable[[Event], None]


class EngineLoop:
    """Runs the scheduler on its own thread; everything touching the engine happens there."""

    def __init__(self, engine: InferenceEngineV2, codec: TextCodec) -> None:
        self.engine = engine
        self.codec = codec
        self.scheduler = ContinuousBatchScheduler(engine, decode=codec.decode)
        self._inbox: queue.Queue[_Submission | int | None] = queue.Queue()
        self._uids = itertools.count()
        self._deliver: dict[int, Callable[[Event], None]] = {}
        self._thread = threading.Thread(target=self._run, name="ds-serve-engine", daemon=True)
        self._thread.start()

    def submit(
        self, prompt: list[int], params: SamplingParams, deliver: Callable[[Event], None]
    ) -> int:
        uid = next(self._uids)
        self._inbox.put(_Submission(uid, prompt, params, deliver))
        return uid

    def abort(self, uid: int) -> None:
        """Stop a request whose client went away (applied on the engine thread)."""
        self._inbox.put(uid)

    def close(self) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=10)

    def _accept(self, sub: _Submission) -> None:
        try:
            self.scheduler.add_request(sub.uid, sub.prompt, sub.params, self._on_token)
        except DsError as exc:
            sub.deliver(("error", str(exc)))
            return
        self._deliver[sub.uid] = sub.deliver

    def _on_token(self, uid: int, token: int, finished: bool) -> None:
        deliver = self._deliver[uid]
        reason = None
        if finished:
            del self._deliver[uid]
            req = next(r for r in self.scheduler.running if r.uid == uid)
            reason = req.finish_reason
        deliver(("token", token, reason))

    def _run(self) -> None:
        while True:
            block = not self.scheduler.has_unfinished()
            try:
                while True:
                    sub = self._inbox.get(block=block)
                    if sub is None:
                        return
                    if isinstance(sub, int):
                        self.scheduler.abort(sub)
                        self._deliver.pop(sub, None)
                    else:
                        self._accept(sub)
                    block = False
            except queue.Empty:
                pass
            if not self.scheduler.has_unfinished():
                continue
            try:
                self.scheduler.step()
                self.scheduler.finished.clear()  # results went out through the callbacks
            except DsError as exc:  # a failed forward fails every request in flight
                log.error("engine step failed", error=str(exc))
                for uid, deliver in list(self._deliver.items()):
                    deliver(("error", str(exc)))
                    if uid in self.engine.state:
                        self.engine.flush(uid)
                self._deliver.clear()
                self.scheduler.running.clear()
                self.scheduler.waiting.clear()


def _float(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    return default if value is None else float(value)


def create_app(engine: InferenceEngineV2, codec: TextCodec, model_name: str) -> Any:
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import JSONResponse, StreamingResponse

    loop_ = EngineLoop(engine, codec)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        yield
        loop_.close()

    app = FastAPI(title="ds serve", lifespan=lifespan)
    app.state.engine_loop = loop_

    @app.exception_handler(HTTPException)
    async def _openai_error(_: Any, exc: HTTPException) -> JSONResponse:
        # The error body shape OpenAI clients parse into their exception message.
        body = {"error": {"message": str(exc.detail), "type": "invalid_request_error"}}
        return JSONResponse(body, status_code=exc.status_code)

    def params_of(body: dict[str, Any]) -> SamplingParams:
        stop = body.get("stop") or ()
        stops = (stop,) if isinstance(stop, str) else tuple(stop)
        try:
            params = SamplingParams(
                max_new_tokens=int(body.get("max_tokens") or 16),
                temperature=_float(body, "temperature", 1.0),
                top_k=int(body.get("top_k") or 0),
                top_p=_float(body, "top_p", 1.0),
                repetition_penalty=float(body.get("repetition_penalty") or 1.0),
                seed=body.get("seed"),
                stop_token_ids=tuple(body.get("stop_token_ids") or ()),
                stop_strings=stops,
            )
            from ds.inference.sampling import validate

            validate(params)
        except (TypeError, ValueError) as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from exc
        if int(body.get("n") or 1) != 1:
            raise HTTPException(status_code=400, detail="only n=1 is supported")
        return params

    def prompt_of(prompt: Any) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            try:
                return codec.encode(prompt)
            except DsError as exc:
                raise HTTPException(status_code=400, detail=str(exc)) from exc
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) and prompt:
            return list(prompt)
        raise HTTPException(
            status_code=400, detail="prompt must be a string or a list of token ids"
        )

    async def events(prompt: list[int], params: SamplingParams) -> AsyncIterator[Event]:
        aloop = asyncio.get_running_loop()
        q: asyncio.Queue[Event] = asyncio.Queue()

        def deliver(ev: Event) -> None:
            aloop.call_soon_threadsafe(q.put_nowait, ev)

        uid = loop_.submit(prompt, params, deliver)
        done = False
        try:
            while not done:
                ev = await q.get()
                done = ev[0] == "error" or ev[2] is not None
                yield ev
        finally:
            if not done:  # the client went away: stop spending forwards on it
                loop_.abort(uid)

    async def run(prompt: list[int], params: SamplingParams, chat: bool, stream: bool) -> Any:
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{next(_ids)}"
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"

        def choice(text: str, reason: str | None, tokens: list[int]) -> dict[str, Any]:
            c: dict[str, Any] = {"index": 0, "finish_reason": reason, "token_ids": tokens}
            if chat:
                key = "delta" if stream else "message"
                c[key] = {"role": "assistant", "content": text}
            else:
                c["text"] = text
                c["logprobs"] = None
            return c

        def cut(text: str) -> str:
            hits = [text.find(s) for s in params.stop_strings if s in text]
            return text[: min(hits)] if hits else text

        if stream:

            async def sse() -> AsyncIterator[str]:
                tokens: list[int] = []
                sent = ""
                async for ev in events(prompt, params):
                    if ev[0] == "error":
                        yield "data: " + json.dumps({"error": {"message": ev[1]}}) + "\n\n"
                        break
                    tokens.append(ev[1])
                    text = cut(codec.decode(tokens))
                    delta, sent = text[len(sent) :], text
                    chunk = {
                        "id": rid,
                        "object": obj + (".chunk" if chat else ""),
                        "created": created,
                        "model": model_name,
                        "choices": [choice(delta, ev[2], [ev[1]])],
                    }
                    yield "data: " + json.dumps(chunk) + "\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(sse(), media_type="text/event-stream")

        tokens: list[int] = []
        reason = None
        async for ev in events(prompt, params):
            if ev[0] == "error":
                raise HTTPException(status_code=400, detail=ev[1])
            tokens.append(ev[1])
            reason = ev[2]
        return JSONResponse(
            {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model_name,
                "choices": [choice(cut(codec.decode(tokens)), reason, tokens)],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(tokens),
                    "total_tokens": len(prompt) + len(tokens),
                },
            }
        )

    _ids = itertools.count()

    @app.get("/health")
    def health() -> dict[str, Any]:
        cap = engine.capacity()
        return {"status": "ok", "free_blocks": cap.free_blocks, "total_blocks": cap.total_blocks}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "ds"}]}

    @app.post("/v1/completions")
    async def completions(body: dict[str, Any]) -> Any:
        return await run(
            prompt_of(body.get("prompt")), params_of(body), False, bool(body.get("stream"))
        )

    @app.post("/v1/chat/completions")
    async def chat(body: dict[str, Any]) -> Any:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPException(status_code=400, detail="messages must be a non-empty list")
        prompt = prompt_of(codec.chat_prompt(messages))
        return await run(prompt, params_of(body), True, bool(body.get("stream")))

    return app
