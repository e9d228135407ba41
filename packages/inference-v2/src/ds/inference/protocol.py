"""Validation of OpenAI completion / chat-completion request bodies, before anything is queued.

Every field is checked for type and range here, so that input can only ever produce a 400 (with
the field named in ``param``) and never reaches the engine thread in a shape it cannot take.
Unknown fields are ignored, as OpenAI-compatible servers do; fields this server cannot honour are
refused rather than silently dropped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ds.inference.chat_template import TemplateError
from ds.inference.openai_errors import APIError, bad_request, needs_grammar
from ds.inference.sampling import SamplingOptions, fold_seed
from ds.inference.tokenizer import TextCodec
from ds.inference.tools import plan_tools
from ds.interfaces.errors import DsError

_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
_MAX_N = 64
_MAX_STOPS = 64
_MAX_LOGPROBS = 20
_MAX_CHOICES = 1024  # prompts x n in one request


@dataclass(frozen=True)
class Limits:
    model_name: str
    max_context: int  # prompt + output tokens of one sequence
    cache_tokens: int  # tokens the whole KV cache holds
    vocab_size: int
    # Characters of prompt text one request may send (checked before tokenizing); None: the
    # default, max(100_000, 32 * max_context).
    max_prompt_chars: int | None = None

    @property
    def prompt_chars(self) -> int:
        if self.max_prompt_chars is not None:
            return self.max_prompt_chars
        return max(100_000, 32 * self.max_context)


@dataclass(frozen=True)
class ParsedRequest:
    chat: bool
    prompts: list[list[int]]  # one or more (a completions request may batch prompts)
    prompt_texts: list[str | None]
    params: list[SamplingOptions]  # one per choice: prompt-major, n per prompt
    stream: bool
    include_usage: bool
    logprobs: int | None  # None: off; k: the sampled token's and k alternatives
    echo: bool
    n: int = 1
    tools: Any = None  # a ds.inference.tools.ToolPlan when the model may call tools

    @property
    def prompt(self) -> list[int]:
        return self.prompts[0]

    def prompt_of(self, choice: int) -> int:
        """The index of the prompt that choice ``choice`` continues."""
        return choice // self.n


def load_body(raw: bytes) -> Any:
    """The JSON body of a request, or a 400: malformed JSON, nesting deeper than the parser
    allows, or text that is not valid Unicode (a lone UTF-16 surrogate such as \\ud800, which
    JSON's escapes can spell but no tokenizer can encode)."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise APIError(
            400, f"We could not parse the JSON body of your request: {exc}", code="invalid_json"
        ) from exc
    except RecursionError:
        raise APIError(
            400, "the JSON body of your request is nested too deeply", code="invalid_json"
        ) from None
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end]
        raise APIError(
            400,
            f"the request contains {bad.encode('unicode_escape').decode()}, a lone UTF-16 "
            "surrogate that is not valid Unicode; send valid UTF-8 text",
            code="invalid_unicode",
        ) from None
    except (RecursionError, ValueError):
        raise APIError(400, "the JSON body of your request is nested too deeply") from None
    return body


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(
    body: dict[str, Any], key: str, default: int | None, lo: int | None, hi: int | None
) -> Any:
    v = body.get(key)
    if v is None:
        return default
    if not _is_int(v):
        raise bad_request(key, f"expected an integer, got {json.dumps(v)}")
    if lo is not None and v < lo:
        raise bad_request(key, f"integer below minimum value; expected >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise bad_request(key, f"integer above maximum value; expected <= {hi}, got {v}")
    return v


def _num(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad_request(key, f"expected a number, got {json.dumps(v)}")
    if not lo <= v <= hi:
        raise bad_request(key, f"expected a number in [{lo}, {hi}], got {v}")
    return float(v)


def _bool(body: dict[str, Any], key: str, default: bool = False) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_request(key, f"expected a boolean, got {json.dumps(v)}")
    return v


def _stops(body: dict[str, Any]) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad_request("stop", f"expected a string or a list of strings, got {json.dumps(v)}")
    if len(items) > _MAX_STOPS:
        raise bad_request("stop", f"at most {_MAX_STOPS} stop strings, got {len(items)}")
    return tuple(s for s in items if s)


def _token_ids(v: Any, key: str, vocab: int) -> list[int]:
    if not isinstance(v, list) or not all(_is_int(t) for t in v):
        raise bad_request(key, "expected a list of integer token ids")
    bad = [t for t in v if not 0 <= t < vocab]
    if bad:
        raise bad_request(key, f"token ids must be in [0, {vocab}); got {bad[:5]}")
    return list(v)


def _logit_bias(body: dict[str, Any], vocab: int) -> tuple[tuple[int, float], ...]:
    v = body.get("logit_bias")
    if v is None:
        return ()
    if not isinstance(v, dict):
        raise bad_request("logit_bias", "expected an object mapping token ids to biases")
    out = []
    for key, bias in v.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise bad_request("logit_bias", f"key {key!r} is not a token id") from None
        if not 0 <= token < vocab:
            raise bad_request("logit_bias", f"token id {token} is outside [0, {vocab})")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise bad_request("logit_bias", f"bias of {token} must be a number in [-100, 100]")
        out.append((token, float(bias)))
    return tuple(out)


def _text_of(content: Any, where: str) -> str:
    """Message content as text: a string, or a list of text parts joined by newlines."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise bad_request(where, "expected a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict) or part.get("type") not in ("text", "input_text"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise bad_request(
                f"{where}[{j}]", f"only text content parts are supported, got {kind!r}"
            )
        if not isinstance(part.get("text"), str):
            raise bad_request(f"{where}[{j}].text", "expected a string")
        texts.append(part["text"])
    return "\n".join(texts)


def messages_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    v = body.get("messages")
    if not isinstance(v, list) or not v:
        raise bad_request("messages", "expected a non-empty list of message objects")
    out = []
    for i, m in enumerate(v):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(where, f"expected a message object, got {json.dumps(m)}")
        role = m.get("role")
        if role not in _ROLES:
            raise bad_request(f"{where}.role", f"expected one of {sorted(_ROLES)}, got {role!r}")
        if "content" not in m and role != "assistant":
            raise bad_request(f"{where}.content", "missing")
        msg = {k: val for k, val in m.items() if k != "content"}
        msg["content"] = _text_of(m.get("content"), f"{where}.content")
        out.append(msg)
    return out


def check_chars(count: int, limits: Limits, param: str) -> None:
    """Refuse prompt text longer than the server's character limit, before tokenizing it."""
    if count > limits.prompt_chars:
        raise APIError(
            400,
            f"Invalid '{param}': {count} characters of prompt text, more than this server's limit "
            f"of {limits.prompt_chars} (ds serve --max-prompt-chars); shorten the prompt",
            param=param,
            code="prompt_too_long",
        )


def _prompts_of(
    body: dict[str, Any], codec: TextCodec, limits: Limits, add_special: bool
) -> tuple[list[list[int]], list[str | None]]:
    """The prompts of a completions request: a string, a list of token ids, or a list of
    either (a batch, as OpenAI and vLLM accept)."""
    v = body.get("prompt")
    batch = v if isinstance(v, list) and v and all(isinstance(p, (str, list)) for p in v) else [v]
    check_chars(sum(len(p) for p in batch if isinstance(p, str)), limits, "prompt")
    prompts: list[list[int]] = []
    texts: list[str | None] = []
    for j, p in enumerate(batch):
        where = "prompt" if len(batch) == 1 else f"prompt[{j}]"
        if isinstance(p, str):
            if not codec.available:
                raise bad_request(where, "this model has no tokenizer; send token ids")
            ids = codec.encode(p, add_special)
            if not ids:
                raise bad_request(where, "the prompt encodes to no tokens")
            prompts.append(ids)
            texts.append(p)
        elif isinstance(p, list) and p and all(_is_int(t) for t in p):
            prompts.append(_token_ids(p, where, limits.vocab_size))
            texts.append(None)
        else:
            raise bad_request(
                where, "expected a non-empty string, a list of token ids, or a list of either"
            )
    return prompts, texts


def _response_format(
    body: dict[str, Any], grammar: Callable[[dict[str, Any] | None], Any] | None
) -> Any:
    v = body.get("response_format")
    if v is None:
        return None
    if not isinstance(v, dict) or v.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request(
            "response_format", "expected {'type': 'text' | 'json_object' | 'json_schema', ...}"
        )
    if v["type"] == "text":
        return None
    schema: dict[str, Any] | None = None
    if v["type"] == "json_schema":
        spec = v.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise bad_request(
                "response_format.json_schema", "expected {'name': ..., 'schema': {...}}"
            )
        schema = spec.get("schema", {})
    if grammar is None:
        raise needs_grammar("response_format", "response_format")
    try:
        return grammar(schema)
    except DsError as exc:
        raise bad_request("response_format", str(exc)) from exc


def _max_tokens(
    body: dict[str, Any], key: str, chat: bool, prompt: list[int], limits: Limits, least: int
) -> int:
    """The output length of one prompt: ``key`` checked against the context and the KV cache,
    else OpenAI's defaults (16 for completions, the rest of the context for chat)."""
    room = limits.max_context - len(prompt)
    if room < least:
        raise APIError(
            400,
            f"This model's maximum context length is {limits.max_context} tokens. However, your "
            f"prompt has {len(prompt)} tokens. Please reduce the length of the "
            f"{'messages' if chat else 'prompt'}.",
            param="messages" if chat else "prompt",
            code="context_length_exceeded",
        )
    max_tokens: int | None = _int(body, key, None, least, None)
    if max_tokens is None:
        max_tokens = min(room, limits.cache_tokens - len(prompt)) if chat else min(16, room)
    if len(prompt) + max_tokens > limits.max_context:
        raise APIError(
            400,
            f"This model's maximum context length is {limits.max_context} tokens. However, you "
            f"requested {len(prompt) + max_tokens} tokens ({len(prompt)} in the "
            f"{'messages' if chat else 'prompt'}, {max_tokens} in the completion). Please reduce "
            f"the length of the {'messages' if chat else 'prompt'} or completion.",
            param=key,
            code="context_length_exceeded",
        )
    if len(prompt) + max_tokens > limits.cache_tokens:
        raise bad_request(
            key,
            f"{len(prompt) + max_tokens} tokens do not fit the whole KV cache "
            f"({limits.cache_tokens} tokens); lower {key} or start the server with more KV memory",
        )
    return max_tokens


def parse(
    body: Any,
    chat: bool,
    codec: TextCodec,
    limits: Limits,
    grammar: Callable[[dict[str, Any] | None], Any] | None = None,
) -> ParsedRequest:
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    model = body.get("model")
    if model is not None and model != limits.model_name:
        raise APIError(
            404,
            f"The model '{model}' does not exist; this server serves '{limits.model_name}'",
            param="model",
            code="model_not_found",
        )
    vocab = limits.vocab_size
    tools = None
    add_special = _bool(body, "add_special_tokens", not chat)
    if chat:
        messages = messages_of(body)
        check_chars(sum(len(m["content"]) for m in messages), limits, "messages")
        if not codec.available:
            raise bad_request("messages", "this model has no tokenizer for chat messages")
        messages, extra, tools = plan_tools(body, messages, codec, grammar)
        try:
            prompts = [codec.chat_ids(messages, add_special, **extra)]
        except TemplateError as exc:
            raise bad_request("messages", str(exc)) from exc
        texts: list[str | None] = [None]
    else:
        prompts, texts = _prompts_of(body, codec, limits, add_special)
    n = _int(body, "n", 1, 1, _MAX_N)
    if len(prompts) * n > _MAX_CHOICES:
        raise bad_request("n", f"{len(prompts)} prompts x n={n} exceed {_MAX_CHOICES} choices")
    if body.get("best_of") not in (None, 1, n):
        raise bad_request("best_of", "only best_of == n is supported")
    if chat and body.get("functions"):
        raise bad_request("functions", "the legacy 'functions' are not supported; send 'tools'")
    if not chat and body.get("suffix"):
        raise bad_request("suffix", "suffix (insertion) is not supported by this server")
    stream = _bool(body, "stream")
    so = body.get("stream_options")
    include_usage = False
    if so is not None:
        if not stream:
            raise bad_request("stream_options", "only allowed when 'stream' is true")
        if not isinstance(so, dict):
            raise bad_request("stream_options", "expected an object")
        include_usage = _bool(so, "include_usage")

    logprobs: int | None
    if chat:
        want = _bool(body, "logprobs")
        top = _int(body, "top_logprobs", None, 0, _MAX_LOGPROBS)
        if top is not None and not want:
            raise bad_request("top_logprobs", "requires 'logprobs': true")
        logprobs = (top or 0) if want else None
        echo = False
    else:
        logprobs = _int(body, "logprobs", None, 0, _MAX_LOGPROBS)
        echo = _bool(body, "echo")
    # echo + logprobs scores the prompt too (OpenAI's legacy completions); then max_tokens may be
    # 0, which scores the prompt and generates nothing (how evaluation harnesses use it).
    score_prompt = echo and logprobs is not None
    least = 0 if score_prompt else 1

    key = "max_tokens"
    if chat and body.get("max_completion_tokens") is not None:
        key = "max_completion_tokens"
    lengths = [_max_tokens(body, key, chat, p, limits, least) for p in prompts]

    stops = _stops(body)
    if stops and not codec.available:
        raise bad_request("stop", "stop strings need a tokenizer; use stop_token_ids")
    stop_ids = body.get("stop_token_ids")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise bad_request("seed", f"expected an integer, got {json.dumps(seed)}")
    top_k = _int(body, "top_k", 0, -1, None)
    base = SamplingOptions(
        max_new_tokens=lengths[0],
        temperature=_num(body, "temperature", 1.0, 0.0, 100.0),
        top_k=max(top_k, 0),  # vLLM's -1 also disables
        top_p=_num(body, "top_p", 1.0, 0.0, 1.0),
        repetition_penalty=_num(body, "repetition_penalty", 1.0, 0.0, 100.0),
        seed=None if seed is None else fold_seed(seed),
        stop_token_ids=tuple(_token_ids(stop_ids, "stop_token_ids", vocab)) if stop_ids else (),
        stop_strings=stops,
        presence_penalty=_num(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_num(body, "frequency_penalty", 0.0, -2.0, 2.0),
        min_p=_num(body, "min_p", 0.0, 0.0, 1.0),
        logit_bias=_logit_bias(body, vocab),
        ignore_eos=_bool(body, "ignore_eos"),
        logprobs=logprobs,
        prompt_logprobs=logprobs if score_prompt else None,
        grammar=_response_format(body, grammar),
    )
    if base.top_p == 0:
        raise bad_request("top_p", "must be > 0")
    if base.repetition_penalty == 0:
        raise bad_request("repetition_penalty", "must be > 0")
    if tools is not None and base.grammar is not None:
        raise bad_request("response_format", "cannot be combined with tools; send one of them")
    if tools is not None:
        base = replace(base, grammar=tools.grammar)
    # Each choice samples on its own stream: choice i of seed s uses seed s + i (per prompt, so
    # a batched prompt gets what it would get alone).
    params = [
        replace(
            base,
            max_new_tokens=length,
            seed=None if base.seed is None else fold_seed(base.seed + i),
        )
        for length in lengths
        for i in range(n)
    ]
    return ParsedRequest(
        chat, prompts, texts, params, stream, include_usage, logprobs, echo, n, tools
    )
