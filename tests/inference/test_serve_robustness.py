"""`ds serve` as a serving engineer tries it: one real server subprocess on 127.0.0.1 (shared by
the module), the OpenAI client and raw HTTP. Bad requests are sent beside valid concurrent ones,
which must come back exactly as when sent alone; outputs are checked against transformers.

The SIGTERM test stops the shared server, so it stays the last test of the module.
"""

from __future__ import annotations

import json
import math
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from serve_harness import KEY, MODEL, Server, check_error, running_server
from serve_model import CHAT_TEMPLATE, EOS_PROMPT, make_model_dir

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(600)]

BLOCKS = 256
ASCII_PROMPTS = ["the lazy dog", "quick brown", "symbols and quotes", "over the"]
UNICODE_PROMPTS = [
    "héllo wörld",
    "日本語のテキスト",
    "emoji 🙂🚀",
    "Ελληνικά κείμενα",
    "русский текст",
    "ça va? naïve",
    "中文文本 한국어",
    "∑∫√π≈≠ «",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model_dir = make_model_dir(tmp_path_factory.mktemp("serve"), MODEL)
    args = ["--block-size", "16", "--num-blocks", str(BLOCKS), "--shutdown-grace", "30"]
    yield from running_server(model_dir, *args)


@pytest.fixture(scope="module")
def hf(server: Server) -> Any:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(server.model_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(server.model_dir)
    return model, tok


# -- valid neighbours -------------------------------------------------------------------------
def _valid_requests(srv: Server) -> list[Callable[[], Any]]:
    def comp(p: str) -> Callable[[], Any]:
        return lambda: srv.complete(prompt=p, max_tokens=12, temperature=0)["choices"][0][
            "token_ids"
        ]

    def chat() -> Any:
        out = srv.chat(messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0)
        return out["choices"][0]["token_ids"]

    def streamed() -> Any:
        chunks = srv.stream(
            "/v1/completions", {"prompt": "over the", "max_tokens": 10, "temperature": 0}
        )
        return [t for c in chunks for t in c["choices"][0]["token_ids"]]

    return [comp(p) for p in ASCII_PROMPTS] + [chat, streamed]


@pytest.fixture(scope="module")
def expected(server: Server) -> list[Any]:
    return [f() for f in _valid_requests(server)]


def _beside_valid(srv: Server, expected: list[Any], bad: Callable[[], None]) -> None:
    """Run ``bad`` while the valid requests run concurrently; they must come back unchanged."""
    results: dict[int, Any] = {}
    errors: list[BaseException] = []

    def run(i: int, f: Callable[[], Any]) -> None:
        try:
            results[i] = f()
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(i, f)) for i, f in enumerate(_valid_requests(srv))
    ]
    for t in threads:
        t.start()
    bad()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert [results[i] for i in range(len(expected))] == expected


# -- items 1, 2, 6: bad input ends alone, as a 4xx with OpenAI's body --------------------------
BAD_COMPLETIONS: list[tuple[dict[str, Any], int, str | None, str]] = [
    ({"prompt": "x", "seed": "abc", "temperature": 0.7}, 400, "seed", "integer"),
    ({"prompt": "x", "seed": 1.5, "temperature": 0.7}, 400, "seed", "integer"),
    ({"prompt": "x", "seed": True, "temperature": 0.7}, 400, "seed", "integer"),
    ({"prompt": [5, 600, 7]}, 400, "prompt", "[0, 512)"),
    ({"prompt": [-1]}, 400, "prompt", "[0, 512)"),
    ({"prompt": []}, 400, "prompt", ""),
    ({"prompt": 5}, 400, "prompt", ""),
    ({"prompt": "x", "stop": 5}, 400, "stop", ""),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens", ">= 1"),
    ({"prompt": "x", "max_tokens": -3}, 400, "max_tokens", ">= 1"),
    ({"prompt": "x", "max_tokens": "5"}, 400, "max_tokens", "integer"),
    ({"prompt": "x", "max_tokens": 5000}, 400, "max_tokens", "maximum context length is 1024"),
    ({"prompt": [1] * 2000}, 400, "prompt", "maximum context length is 1024"),
    ({"prompt": [1] * 2000, "stream": True}, 400, "prompt", "maximum context length"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature", ""),
    ({"prompt": "x", "temperature": -1}, 400, "temperature", ""),
    ({"prompt": "x", "top_p": 2}, 400, "top_p", ""),
    ({"prompt": "x", "n": 0}, 400, "n", ""),
    ({"prompt": "x", "n": "2"}, 400, "n", ""),
    ({"prompt": "x", "logprobs": 50}, 400, "logprobs", ""),
    ({"prompt": "x", "logit_bias": {"abc": 1}}, 400, "logit_bias", ""),
    ({"prompt": "x", "logit_bias": {"99999": 1}}, 400, "logit_bias", ""),
    ({"prompt": "x", "logit_bias": {"5": 500}}, 400, "logit_bias", ""),
    ({"prompt": "x", "presence_penalty": 5}, 400, "presence_penalty", ""),
    ({"prompt": "x", "frequency_penalty": "x"}, 400, "frequency_penalty", ""),
    ({"prompt": "x", "min_p": 2}, 400, "min_p", ""),
    ({"prompt": "x", "stream": "yes"}, 400, "stream", ""),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options", ""),
    ({"prompt": "x", "echo": "yes", "logprobs": 1}, 400, "echo", ""),
    ({"prompt": "x", "max_tokens": 0, "logprobs": 1}, 400, "max_tokens", ""),
    ({"prompt": "x", "response_format": {"type": "xml"}}, 400, "response_format", ""),
    ({"prompt": "x", "model": "gpt-4"}, 404, "model", "gpt-4"),
]
BAD_CHATS: list[tuple[dict[str, Any], int, str | None, str]] = [
    ({"messages": [1]}, 400, "messages[0]", ""),
    ({"messages": []}, 400, "messages", ""),
    ({"messages": "hi"}, 400, "messages", ""),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role", ""),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", ""),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        400,
        "messages[0].content[0]",
        "image_url",
    ),
    ({"messages": [{"role": "user", "content": "x"}], "stop": 5}, 400, "stop", ""),
    (
        {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
        400,
        "top_logprobs",
        "",
    ),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens", ""),
]


def test_bad_requests_get_openai_errors_beside_valid_ones(
    server: Server, expected: list[Any]
) -> None:
    def bad() -> None:
        for body, status, param, word in BAD_COMPLETIONS:
            check_error(
                server.post("/v1/completions", {"model": MODEL, **body}), status, param, word
            )
        for body, status, param, word in BAD_CHATS:
            check_error(
                server.post("/v1/chat/completions", {"model": MODEL, **body}), status, param, word
            )
        # Malformed JSON and non-object bodies: 400 with OpenAI's body, not FastAPI's 422.
        check_error(server.post("/v1/completions", raw=b"{bad json"), 400, None, "JSON")
        check_error(server.post("/v1/chat/completions", [1, 2]), 400, None, "JSON object")
        check_error(server.http.get("/v1/nope"), 404, None)
        check_error(server.http.get("/v1/completions"), 405, None)

    _beside_valid(server, expected, bad)
    # The OpenAI client parses these bodies into its exceptions.
    with pytest.raises(openai.BadRequestError, match="seed"):
        server.client.completions.create(model=MODEL, prompt="x", seed="abc", temperature=0.7)  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError, match="gpt-4"):
        server.client.completions.create(model="gpt-4", prompt="x")
    health = server.http.get("/health")
    assert health.status_code == 200 and health.json()["free_blocks"] == BLOCKS


def test_any_integer_seed_is_reproducible(server: Server, expected: list[Any]) -> None:
    """2**70 used to crash the engine thread (every later request hung)."""
    results: dict[int, list[list[int]]] = {}

    def seeded() -> None:
        for seed in (2**70, -3, 2**64 + 5):
            runs = [
                server.complete(prompt="x y", max_tokens=8, temperature=0.7, seed=seed)
                for _ in range(2)
            ]
            results[seed] = [r["choices"][0]["token_ids"] for r in runs]

    _beside_valid(server, expected, seeded)
    for runs in results.values():
        assert runs[0] == runs[1]
    assert results[2**70] != results[-3]


# -- item 3: streaming == non-streaming ----------------------------------------------------------
def test_stream_equals_non_stream_with_multibyte_text_and_stop_strings(server: Server) -> None:
    for prompt in UNICODE_PROMPTS:
        body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        full = server.complete(**body)["choices"][0]
        chunks = server.stream("/v1/completions", body)
        assert "".join(c["choices"][0]["text"] for c in chunks) == full["text"], prompt
        assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == full["token_ids"]
        text = full["text"]
        if len(text) < 6:
            continue
        # A stop string that spans token boundaries: cut there in both modes, never leaked.
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        want = text[: text.find(stop)]
        stopped = server.complete(**body, stop=[stop])["choices"][0]
        chunks = server.stream("/v1/completions", {**body, "stop": [stop]})
        streamed = "".join(c["choices"][0]["text"] for c in chunks)
        assert stopped["text"] == want == streamed, (prompt, stop)
        assert stopped["finish_reason"] == "stop" == chunks[-1]["choices"][0]["finish_reason"]


# -- item 4: EOS ------------------------------------------------------------------------------------
def test_eos_of_the_model_ends_generation_unless_ignore_eos(server: Server, hf: Any) -> None:
    model, tok = hf
    eos = json.loads((server.model_dir / "generation_config.json").read_text())["eos_token_id"]
    ids = torch.tensor([tok(EOS_PROMPT).input_ids])
    with torch.no_grad():  # transformers stops at the generation config's EOS
        want = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False
        )[0, ids.shape[1] :].tolist()
    assert want[-1] == eos and len(want) < 40
    out = server.complete(prompt=EOS_PROMPT, max_tokens=40, temperature=0)["choices"][0]
    assert out["token_ids"] == want and out["finish_reason"] == "stop"
    long = server.complete(prompt=EOS_PROMPT, max_tokens=40, temperature=0, ignore_eos=True)
    c = long["choices"][0]
    assert len(c["token_ids"]) == 40 and c["finish_reason"] == "length"
    assert c["token_ids"][: len(want)] == want


# -- item 5: abandoned requests ---------------------------------------------------------------------
def test_abandoned_requests_are_aborted(server: Server) -> None:
    aborted = server.metric("ds_request_finished_total")
    before = server.metric("ds_request_finished_total", finished_reason="abort")
    body = {"model": MODEL, "prompt": "the lazy dog", "max_tokens": 1000, "ignore_eos": True}
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    # A client that gives up: it hangs up once the server holds KV blocks for its request, without
    # reading an answer. (A client-side timeout instead races the generation on a fast machine.)
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(head.encode() + payload)
        deadline = time.monotonic() + 30
        while server.free_blocks() == BLOCKS:
            assert time.monotonic() < deadline, "the request was never admitted"
            time.sleep(0.005)
    deadline = time.monotonic() + 10
    while (
        server.free_blocks() != BLOCKS
        or server.metric("ds_request_finished_total", finished_reason="abort") != before + 1
    ):
        assert time.monotonic() < deadline, (
            "the abandoned non-streaming request still runs",
            server.free_blocks(),
            [x for x in server.http.get("/metrics").text.splitlines() if "finished_total" in x],
        )
        time.sleep(0.1)
    # And a stream closed after two chunks.
    stream = server.client.completions.create(
        model=MODEL,
        prompt="the lazy dog",
        max_tokens=1000,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    it = iter(stream)
    next(it)
    next(it)
    stream.close()
    deadline = time.monotonic() + 10
    while server.free_blocks() != BLOCKS:
        assert time.monotonic() < deadline, "the abandoned stream still holds KV blocks"
        time.sleep(0.1)
    assert server.metric("ds_request_finished_total") >= aborted + 2


# -- item 7: chat template ----------------------------------------------------------------------------
def test_chat_uses_the_tokenizers_template_and_bos(server: Server, hf: Any) -> None:
    model, tok = hf
    assert tok.chat_template == CHAT_TEMPLATE
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "héllo, fox?"},
    ]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    want_ids = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
    assert want_ids[0] == tok.bos_token_id and want_ids.count(tok.bos_token_id) == 1
    out = server.chat(messages=messages, max_tokens=10, temperature=0, ignore_eos=True)
    assert out["usage"]["prompt_tokens"] == len(want_ids)
    ids = torch.tensor([want_ids])
    with torch.no_grad():
        ref = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=10,
            min_new_tokens=10,
            do_sample=False,
            eos_token_id=None,
        )[0, ids.shape[1] :].tolist()
    assert out["choices"][0]["token_ids"] == ref
    # Content parts render as their text, not as a Python repr.
    parts = [
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": [{"type": "text", "text": "héllo, fox?"}]},
    ]
    again = server.chat(messages=parts, max_tokens=10, temperature=0, ignore_eos=True)
    assert again["choices"][0]["token_ids"] == ref
    # Plain prompts get the BOS the tokenizer adds.
    comp = server.complete(prompt="the lazy dog", max_tokens=1)
    assert comp["usage"]["prompt_tokens"] == len(tok("the lazy dog").input_ids)


# -- item 8: sampling parameters --------------------------------------------------------------------
def _reference(model: Any, prompt: list[int], n: int, adjust: Callable[..., Any]) -> Any:
    ids, out, lps = list(prompt), [], []
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        lps.append(torch.log_softmax(logits, -1))
        tok = int(torch.argmax(adjust(logits.clone(), out)))
        out.append(tok)
        ids.append(tok)
    return out, lps


def test_sampling_parameters_take_effect(server: Server, hf: Any) -> None:
    model, tok = hf
    prompt = tok("quick brown").input_ids
    base = {"prompt": "quick brown", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    plain = server.complete(**base)["choices"][0]["token_ids"]

    # logprobs: the model's log-probabilities, the sampled token's and the top ones.
    out = server.complete(**base, logprobs=3)["choices"][0]
    ref, lps = _reference(model, prompt, 12, lambda x, _: x)
    assert out["token_ids"] == ref == plain
    lp = out["logprobs"]
    assert len(lp["token_logprobs"]) == 12 and len(lp["text_offset"]) == 12
    for got, t, dist in zip(lp["token_logprobs"], ref, lps):
        assert math.isclose(got, float(dist[t]), abs_tol=1e-4)
    chat = server.chat(
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )["choices"][0]
    content = chat["logprobs"]["content"]
    assert len(content) == 4 and all(len(c["top_logprobs"]) == 2 for c in content)
    assert all(c["top_logprobs"][0]["logprob"] >= c["logprob"] - 1e-6 for c in content)

    # presence / frequency penalties, as OpenAI defines them, against a reference loop.
    def penal(x: torch.Tensor, gen: list[int]) -> torch.Tensor:
        for t in set(gen):
            x[t] -= 0.8 * gen.count(t) + 1.5
        return x

    want, _ = _reference(model, prompt, 12, penal)
    assert want != plain
    pen = server.complete(**base, presence_penalty=1.5, frequency_penalty=0.8)
    assert pen["choices"][0]["token_ids"] == want

    # logit_bias: +100 forces a token, -100 bans the greedy one.
    forced = server.complete(**base, logit_bias={"77": 100})["choices"][0]["token_ids"]
    assert forced == [77] * 12
    banned = server.complete(**base, logit_bias={str(plain[0]): -100})["choices"][0]
    assert banned["token_ids"][0] != plain[0]

    # min_p = 1 keeps only the most likely token: sampling becomes greedy.
    minp = server.complete(**{**base, "temperature": 1.0}, min_p=1.0, seed=3)
    assert minp["choices"][0]["token_ids"] == plain

    # echo returns the prompt before the completion.
    echo = server.complete(**base, echo=True)["choices"][0]
    assert echo["text"].startswith("quick brown") and echo["token_ids"] == plain

    # echo + logprobs scores the prompt: its first token null, the rest as transformers gives;
    # max_tokens 0 scores without generating (how evaluation harnesses use it).
    with torch.no_grad():
        full = torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), -1)
    scored = server.complete(**{**base, "max_tokens": 0}, echo=True, logprobs=2)["choices"][0]
    assert scored["text"] == "quick brown" and scored["token_ids"] == []
    slp = scored["logprobs"]
    assert slp["token_logprobs"][0] is None and slp["top_logprobs"][0] is None
    assert len(slp["token_logprobs"]) == len(prompt) and slp["text_offset"][0] == 0
    for i, got in enumerate(slp["token_logprobs"][1:]):
        assert math.isclose(got, float(full[i, prompt[i + 1]]), abs_tol=1e-4)
    both = server.complete(**base, echo=True, logprobs=1)["choices"][0]
    assert both["token_ids"] == plain and both["text"].startswith("quick brown")
    assert both["logprobs"]["token_logprobs"][: len(prompt)] == slp["token_logprobs"]
    assert len(both["logprobs"]["tokens"]) == len(prompt) + 12
    # Streamed, the echo chunk carries the prompt's scores; the texts and scores are the same.
    chunks = server.stream("/v1/completions", {**base, "echo": True, "logprobs": 1})
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    lps = [v for c in chunks if c["choices"] for v in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert text == both["text"] and lps == both["logprobs"]["token_logprobs"]

    # n > 1: n choices; choice 0 is what n=1 gives with the same seed.
    sampled = {**base, "temperature": 1.0, "seed": 11}
    one = server.complete(**sampled)["choices"][0]["token_ids"]
    many = server.complete(**sampled, n=3)
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    assert many["choices"][0]["token_ids"] == one
    assert len({tuple(c["token_ids"]) for c in many["choices"]}) > 1
    assert many["usage"]["completion_tokens"] == 36

    # stream_options.include_usage: a last chunk with the usage and no choices.
    chunks = server.stream(
        "/v1/completions", {**base, "stream_options": {"include_usage": True}, "n": 2}
    )
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 24
    assert all(c["usage"] is None for c in chunks[:-1])


def test_json_schema_response_format(server: Server) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "pick": {"enum": ["fox", "dog"]}},
        "required": ["ok", "pick"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    for seed in range(3):
        out = server.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "answer"}],
            max_tokens=60,
            temperature=1.0,
            seed=seed,
            response_format=fmt,  # type: ignore[arg-type]
        )
        value = json.loads(out.choices[0].message.content or "")
        assert set(value) == {"ok", "pick"} and isinstance(value["ok"], bool)
        assert value["pick"] in ("fox", "dog")
        assert out.choices[0].finish_reason == "stop"


# -- operations --------------------------------------------------------------------------------
def test_metrics_and_api_key(server: Server) -> None:
    server.complete(prompt="the lazy dog", max_tokens=3)
    text = server.http.get("/metrics").text
    for name in (
        "ds_num_requests_running",
        "ds_num_requests_waiting",
        "ds_kv_cache_used_blocks",
        "ds_kv_cache_free_blocks",
        "ds_prefix_cache_hit_rate",
        "ds_time_to_first_token_seconds_bucket",
        "ds_time_per_output_token_seconds_bucket",
    ):
        assert name in text, name
    assert server.metric("ds_time_to_first_token_seconds_count") >= 1
    assert server.metric("ds_kv_cache_free_blocks") == BLOCKS
    unauth = httpx.post(server.url + "/v1/completions", json={"prompt": "x"})
    check_error(unauth, 401, None, "API key")
    assert httpx.get(server.url + "/health").status_code == 200  # probes need no key


# -- item 1: SIGTERM drains and exits (stops the shared server: keep last) ---------------------
def test_sigterm_drains_in_flight_requests_and_exits(server: Server) -> None:
    body = {"prompt": "the lazy dog", "max_tokens": 60, "ignore_eos": True, "stream": True}
    tokens: list[int] = []
    reason = None
    with server.http.stream("POST", "/v1/completions", json={"model": MODEL, **body}) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                tokens += json.loads(line[6:])["choices"][0]["token_ids"]
                break
        server.proc.send_signal(signal.SIGTERM)
        for line in lines:
            if line.startswith("data: {"):
                c = json.loads(line[6:])["choices"][0]
                tokens += c["token_ids"]
                reason = c["finish_reason"] or reason
    assert len(tokens) == 60 and reason == "length"  # drained, not cut off
    assert server.proc.wait(timeout=40) == 0
