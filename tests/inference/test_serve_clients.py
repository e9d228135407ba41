"""`ds serve` as real clients use it: structured output that always parses and keeps the
schema's order, lm-evaluation-harness's batched and BOS-free completions, prompts too long or not
Unicode, and the request-latency metrics. One real server subprocess shared by the module."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serve_harness import MODEL, Server, check_error, running_server
from serve_model import make_model_dir

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("fastapi")
pytest.importorskip("xgrammar")

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(600)]

PROMPT_CHARS = 50_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model_dir = make_model_dir(tmp_path_factory.mktemp("clients"), MODEL)
    args = ["--block-size", "16", "--num-blocks", "256", "--max-prompt-chars", str(PROMPT_CHARS)]
    yield from running_server(model_dir, *args)


@pytest.fixture(scope="module")
def tok(server: Server) -> Any:
    import transformers

    return transformers.AutoTokenizer.from_pretrained(server.model_dir)


# -- structured output ---------------------------------------------------------------------------
SCHEMA = {
    "type": "object",
    "properties": {
        "zeta": {"type": "string", "minLength": 2, "maxLength": 12},
        "alpha": {"type": "boolean"},
        "mid": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
    },
    "required": ["zeta", "alpha", "mid"],
    "additionalProperties": False,
}


def test_json_schema_output_parses_validates_and_keeps_the_schemas_order(server: Server) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    for seed in range(12):
        out = server.chat(
            messages=[{"role": "user", "content": "answer in JSON"}],
            max_tokens=120,
            temperature=1.0,
            seed=seed,
            response_format=fmt,
        )
        text = out["choices"][0]["message"]["content"]
        value = json.loads(text)  # raw control characters in a string would not parse
        jsonschema.validate(value, SCHEMA)
        assert list(value) == ["zeta", "alpha", "mid"], text
        assert out["choices"][0]["finish_reason"] == "stop"


# -- lm-evaluation-harness ---------------------------------------------------------------------
def _scores(server: Server, prompt: Any, **extra: Any) -> list[Any]:
    out = server.complete(prompt=prompt, max_tokens=0, echo=True, logprobs=1, **extra)
    return list(out["choices"][0]["logprobs"]["token_logprobs"])


def test_add_special_tokens_false_scores_the_text_without_bos(server: Server, tok: Any) -> None:
    text = "the lazy dog jumps"
    plain = tok(text, add_special_tokens=False).input_ids
    with_bos = tok(text).input_ids
    assert with_bos == [tok.bos_token_id, *plain]
    assert _scores(server, text, add_special_tokens=False) == _scores(server, plain)
    assert _scores(server, text) == _scores(server, with_bos)
    out = server.complete(prompt=text, add_special_tokens=False, max_tokens=4, temperature=0)
    assert out["usage"]["prompt_tokens"] == len(plain)
    assert (
        out["choices"][0]["token_ids"]
        == server.complete(prompt=plain, max_tokens=4, temperature=0)["choices"][0]["token_ids"]
    )


def test_a_batch_of_prompts_equals_the_prompts_sent_alone(server: Server, tok: Any) -> None:
    texts = ["the lazy dog", "quick brown fox jumps", "héllo wörld"]
    body = {"max_tokens": 6, "temperature": 0.8, "seed": 5, "n": 2, "ignore_eos": True}
    alone = [server.complete(prompt=t, **body)["choices"] for t in texts]
    batch = server.complete(prompt=texts, **body)
    assert [c["index"] for c in batch["choices"]] == list(range(6))
    for p, choices in enumerate(alone):
        for i, c in enumerate(choices):
            assert batch["choices"][p * 2 + i]["token_ids"] == c["token_ids"]
            assert batch["choices"][p * 2 + i]["text"] == c["text"]
    assert batch["usage"]["prompt_tokens"] == sum(len(tok(t).input_ids) for t in texts)
    assert batch["usage"]["completion_tokens"] == 36
    # Token-id prompts batch the same way, and a stream carries every choice.
    ids = [tok(t).input_ids for t in texts]
    by_ids = server.complete(prompt=ids, **body)
    assert [c["token_ids"] for c in by_ids["choices"]] == [c["token_ids"] for c in batch["choices"]]
    streamed: dict[int, list[int]] = {}
    for chunk in server.stream("/v1/completions", {"prompt": texts, **body}):
        for c in chunk["choices"]:
            streamed.setdefault(c["index"], []).extend(c["token_ids"])
    assert [streamed[i] for i in range(6)] == [c["token_ids"] for c in batch["choices"]]
    # Each echoed choice starts with its own prompt.
    echoed = server.complete(prompt=texts, echo=True, max_tokens=2, temperature=0)["choices"]
    assert [c["text"][: len(t)] for c, t in zip(echoed, texts)] == texts


# -- bad input -----------------------------------------------------------------------------------
def test_huge_prompts_are_refused_before_tokenizing_beside_a_stream(server: Server) -> None:
    body = {"prompt": "the lazy dog", "max_tokens": 40, "ignore_eos": True, "temperature": 0}
    solo = [t for c in server.stream("/v1/completions", body) for t in c["choices"][0]["token_ids"]]
    got: list[int] = []
    thread = threading.Thread(
        target=lambda: got.extend(
            t for c in server.stream("/v1/completions", body) for t in c["choices"][0]["token_ids"]
        )
    )
    thread.start()
    huge = "lazy dog " * 111_112  # 1M characters
    r = server.post("/v1/completions", {"model": MODEL, "prompt": huge, "max_tokens": 1})
    check_error(r, 400, "prompt", str(PROMPT_CHARS), "--max-prompt-chars")
    assert r.json()["error"]["code"] == "prompt_too_long"
    r = server.post("/v1/completions", {"model": MODEL, "prompt": ["x", huge]})
    check_error(r, 400, "prompt", str(PROMPT_CHARS))
    chat = {"model": MODEL, "messages": [{"role": "user", "content": huge}]}
    check_error(server.post("/v1/chat/completions", chat), 400, "messages", str(PROMPT_CHARS))
    thread.join(timeout=120)
    assert got == solo
    health = server.http.get("/health").json()
    assert health["status"] == "ok" and health["free_blocks"] == health["total_blocks"]


def test_invalid_unicode_and_deep_json_are_400(server: Server) -> None:
    lone = b'{"model": "tiny-serve", "prompt": "abc \\ud800 def", "max_tokens": 2}'
    r = server.post("/v1/completions", raw=lone)
    check_error(r, 400, None, "\\ud800", "surrogate")
    assert r.json()["error"]["code"] == "invalid_unicode"
    chat = b'{"messages": [{"role": "user", "content": "hi \\udfff"}], "max_tokens": 2}'
    check_error(server.post("/v1/chat/completions", raw=chat), 400, None, "\\udfff")
    deep = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    check_error(server.post("/v1/completions", raw=deep), 400, None, "nested too deeply")
    # A schema nearly as deep as the JSON parser allows: a 400, not a crash of the compiler.
    schema = '{"type": "object", "properties": {"a": ' * 300 + "{}" + "}}" * 300
    fmt = '{"type": "json_schema", "json_schema": {"name": "deep", "schema": ' + schema + "}}"
    raw = '{"prompt": "x", "response_format": ' + fmt + "}"
    r = server.post("/v1/completions", raw=raw.encode())
    check_error(r, 400, "response_format", "nested too deeply")
    # A valid pair of surrogates (one character outside the BMP) is fine.
    pair = b'{"model": "tiny-serve", "prompt": "emoji \\ud83d\\ude80", "max_tokens": 2}'
    assert server.post("/v1/completions", raw=pair).status_code == 200
    assert server.http.get("/health").json()["status"] == "ok"


# -- metrics ---------------------------------------------------------------------------------------
def test_request_latency_metrics(server: Server) -> None:
    before = server.metric("ds_e2e_request_latency_seconds_count")
    for p in ("the lazy dog", "quick brown"):
        server.complete(prompt=p, max_tokens=5, ignore_eos=True)
    text = server.http.get("/metrics").text
    assert "_created" not in text
    assert server.metric("ds_e2e_request_latency_seconds_count") == before + 2
    for name in ("queue", "prefill", "decode"):
        count = server.metric(f"ds_request_{name}_time_seconds_count")
        assert count == before + 2, name
    assert 'ds_num_preemptions_total{model_name="tiny-serve"} 0.0' in text
    # Each request's queue + prefill + decode time is its end-to-end time.
    parts = sum(
        server.metric(f"ds_request_{n}_time_seconds_sum") for n in ("queue", "prefill", "decode")
    )
    assert parts == pytest.approx(server.metric("ds_e2e_request_latency_seconds_sum"), rel=1e-6)
