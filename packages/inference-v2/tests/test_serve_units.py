"""Serving pieces without a subprocess: incremental detokenization, request validation defaults,
per-request failure isolation in the scheduler, n > 1 prompt sharing, EOS from the checkpoint,
the engine thread's death, chat templates."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from inference_models import prompts

from ds.inference import ContinuousBatchScheduler, SamplingParams, build_engine, generate
from ds.inference.detokenize import IncrementalText
from ds.inference.sampling import SamplingOptions
from ds.interfaces.errors import InferenceError


# -- detokenization --------------------------------------------------------------------------
def _utf8_pieces(text: str) -> tuple[list[int], Any]:
    """A byte 'tokenizer': token i is byte i; decoding replaces broken sequences like HF."""
    data = list(text.encode())

    def decode(ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    return data, decode


def test_incremental_text_never_splits_characters() -> None:
    ids, decode = _utf8_pieces("héllo 日本 🙂!")
    inc = IncrementalText(decode)
    pieces = [inc.push(t) for t in ids] + [inc.finish()]
    assert "".join(pieces) == "héllo 日本 🙂!"
    assert all("\ufffd" not in p for p in pieces)


def test_incremental_text_holds_back_stop_strings() -> None:
    words = ["a", "b", "c", "s", "t", "d"]
    decode = lambda ids: " ".join(words[i] for i in ids)  # noqa: E731
    inc = IncrementalText(decode, ["s t"])
    out = [inc.push(i) for i in range(len(words))]
    # " s" could start "s t": held until " t" completes the stop, then neither is released.
    assert out[:4] == ["a", " b", " c", " "]
    assert "".join(out) + inc.finish() == "a b c " and inc.stopped
    # Text that only looked like a stop's start is released when the request ends.
    inc = IncrementalText(decode, ["s x"])
    got = "".join(inc.push(i) for i in range(4)) + inc.finish()
    assert got == "a b c s"


# -- request validation ----------------------------------------------------------------------
def test_max_tokens_defaults_follow_openai(tiny_dirs: dict[str, Path]) -> None:
    from ds.inference.openai_errors import APIError
    from ds.inference.protocol import Limits, parse
    from ds.inference.tokenizer import TextCodec

    codec = TextCodec(None)
    limits = Limits("m", 1024, 4096, 512)
    comp = parse({"prompt": [1, 2, 3]}, False, codec, limits)
    assert comp.params[0].max_new_tokens == 16
    with pytest.raises(APIError, match="maximum context length is 1024") as err:
        parse({"prompt": [1] * 1000, "max_tokens": 30}, False, codec, limits)
    assert err.value.param == "max_tokens" and err.value.code == "context_length_exceeded"
    # Chat without max_tokens: the rest of the context (OpenAI's default).
    from ds.inference import chat_template as ct

    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    words = TextCodec(_word_tokenizer(), template)
    chat = parse({"messages": [{"role": "user", "content": "w1 w2"}]}, True, words, limits)
    assert chat.prompt == [1, 2] and chat.params[0].max_new_tokens == 1022
    assert ct.render(template, [{"content": "x"}], {}) == "x"
    # Seeds: any integer, folded into the generator's range; n choices get distinct streams.
    big = parse({"prompt": [1], "seed": 2**70, "n": 3}, False, codec, limits)
    assert [p.seed for p in big.params] == [(2**70 + i) % 2**64 for i in range(3)]


def _word_tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(512)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def test_chat_template_override_and_tokenizer_config(tmp_path: Path) -> None:
    from ds.inference.tokenizer import TextCodec

    _word_tokenizer().save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": {"content": "w1", "special": True},
                "chat_template": "{{ bos_token }}{% for m in messages %} {{ m.content }}{% endfor %}",
            }
        )
    )
    codec = TextCodec.from_dir(tmp_path)
    assert codec.chat_ids([{"role": "user", "content": "w7"}]) == [1, 7]
    override = tmp_path / "t.jinja"
    override.write_text("w9{% for m in messages %} {{ m.content }}{% endfor %}")
    assert TextCodec.from_dir(tmp_path, str(override)).chat_ids([{"content": "w7"}]) == [9, 7]
    inline = TextCodec.from_dir(tmp_path, "w5 {{ messages[0].content }}")
    assert inline.chat_ids([{"content": "w7"}]) == [5, 7]


# -- scheduler isolation ---------------------------------------------------------------------
POISON = 7


def _poisoned(engine: Any) -> None:
    """A model that fails on any batch holding token POISON (a stand-in for a sequence-local
    failure such as a window overflow)."""
    forward = engine.model.forward

    def guarded(batch: Any, cache: Any) -> torch.Tensor:
        if bool((batch.token_ids == POISON).any()):
            raise InferenceError("poisoned token in batch")
        return forward(batch, cache)

    engine.model.forward = guarded


def test_a_failing_sequence_ends_alone(tiny_dirs: dict[str, Path]) -> None:
    engine = build_engine(tiny_dirs["llama"], {"kv_cache": {"block_size": 16, "num_blocks": 64}})
    good = [[p for p in q if p != POISON] for q in prompts(4, 5, 60, seed=2)]
    want = [r.tokens for r in generate(engine, good, SamplingParams(max_new_tokens=10))]
    _poisoned(engine)
    errors: dict[int, str] = {}
    sched = ContinuousBatchScheduler(engine, on_error=lambda uid, msg: errors.__setitem__(uid, msg))
    for i, p in enumerate(good):
        sched.add_request(i, p, SamplingParams(max_new_tokens=10))
    sched.add_request(9, [1, 2, POISON, 3], SamplingParams(max_new_tokens=10))
    while sched.has_unfinished():
        sched.step()
    assert [sched.finished[i].generated for i in range(4)] == want
    assert set(errors) == {9} and "poisoned" in errors[9]
    assert sched.failed[9].finish_reason == "error"
    assert engine.capacity().free_blocks == 64 and engine.state.active_sequences == 0
    # generate() reports the failure after the others ran.
    with pytest.raises(InferenceError, match="prompt 1 failed: poisoned"):
        generate(engine, [good[0], [POISON, 1]], SamplingParams(max_new_tokens=3))


def test_bad_input_is_refused_before_batching(tiny_dirs: dict[str, Path]) -> None:
    engine = build_engine(tiny_dirs["llama"])
    sched = ContinuousBatchScheduler(engine)
    with pytest.raises(InferenceError, match=r"\[0, 512\)"):
        sched.add_request(0, [5, 600], SamplingParams())
    with pytest.raises(InferenceError, match="logit_bias"):
        sched.add_request(1, [5], SamplingOptions(logit_bias=((900, 1.0),)))
    assert not sched.has_unfinished()
    # A seed of any size is folded, not an engine crash.
    sched.add_request(2, [5, 6], SamplingParams(temperature=0.7, seed=2**70, max_new_tokens=2))
    while sched.has_unfinished():
        sched.step()
    assert len(sched.finished[2].generated) == 2


def test_n_siblings_share_the_prompt_blocks(tiny_dirs: dict[str, Path]) -> None:
    engine = build_engine(tiny_dirs["llama"], {"kv_cache": {"block_size": 16, "num_blocks": 64}})
    prompt = prompts(1, 70, 70, seed=5)[0]
    solo = generate(engine, [prompt], SamplingParams(max_new_tokens=6))[0].tokens
    sched = ContinuousBatchScheduler(engine)
    sched.add_request(0, prompt, SamplingParams(max_new_tokens=6))
    sched.add_request(1, prompt, SamplingParams(max_new_tokens=6), share_from=0)
    sched.add_request(2, prompt, SamplingParams(max_new_tokens=6), share_from=0)
    shared = None
    while sched.has_unfinished():
        sched.step()
        seqs = [engine.state.get(u) for u in (0, 1, 2)]
        if shared is None and all(s is not None and s.seen_tokens for s in seqs):
            shared = [s.blocks[:4] for s in seqs if s is not None]
            assert all(engine.allocator.refcount(b) == 3 for b in shared[0])
    assert shared is not None and shared[0] == shared[1] == shared[2]
    assert [sched.finished[u].generated for u in (0, 1, 2)] == [solo] * 3
    assert sched.finished[1].cached_prefix == 64  # 4 full blocks, the last token recomputed
    assert engine.capacity().free_blocks == 64


def test_eos_from_generation_config(tmp_path: Path) -> None:
    from inference_models import make_model

    model = make_model("llama")
    model.config.eos_token_id = 3
    model.generation_config.eos_token_id = [4, 5]
    model.save_pretrained(tmp_path, safe_serialization=True)
    engine = build_engine(tmp_path)
    assert engine.eos_token_ids == (3, 4, 5)
    free = generate(engine, [[1, 2, 3]], SamplingParams(max_new_tokens=20))[0].tokens
    eos = free[4]
    engine.eos_token_ids = (eos,)
    stopped = generate(engine, [[1, 2, 3]], SamplingParams(max_new_tokens=20), stop_at_eos=True)
    assert stopped[0].tokens == free[: free.index(eos) + 1]
    assert stopped[0].finish_reason == "stop"
    ignored = generate(
        engine, [[1, 2, 3]], SamplingOptions(max_new_tokens=20, ignore_eos=True), stop_at_eos=True
    )
    assert ignored[0].tokens == free


def test_context_limit_comes_from_the_model(tiny_dirs: dict[str, Path]) -> None:
    assert build_engine(tiny_dirs["llama"]).max_context == 1024  # max_position_embeddings
    assert build_engine(tiny_dirs["llama"], {"max_model_len": 300}).max_context == 300
    sched = ContinuousBatchScheduler(build_engine(tiny_dirs["llama"]))
    with pytest.raises(InferenceError, match="context of 1024"):
        sched.add_request(0, [1] * 1000, SamplingParams(max_new_tokens=30))


# -- engine thread death ---------------------------------------------------------------------
def test_engine_death_turns_health_503_and_serve_exits_1(tiny_dirs: dict[str, Path]) -> None:
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from ds.inference.cli import serve
    from ds.inference.server import create_app
    from ds.inference.tokenizer import TextCodec

    engine = build_engine(tiny_dirs["llama"], {"kv_cache": {"num_blocks": 32}})
    app = create_app(engine, TextCodec(None), "m")
    loop = app.state.engine_loop
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(serve(app, "127.0.0.1", port, 2.0)))
    t.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            assert httpx.get(url + "/health").status_code == 200
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    ok = httpx.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200

    def broken() -> bool:  # a bug in the loop itself, not in any request
        # Fail with the next request in hand: the thread may call this before the request below
        # is sent (it finishes its last iteration after the reply went out), and a loop that
        # died idle would stop the server before the request reached it. When the request got
        # in first (accepted by the iteration already under way), it is in flight: fail now.
        if not loop.scheduler.has_unfinished():
            loop._inbox.put(loop._inbox.get())
        raise RuntimeError("engine bug")

    loop._iteration = broken
    dead = httpx.post(url + "/v1/completions", json={"prompt": [1, 2]}, timeout=30)
    assert dead.status_code in (500, 503) and "engine" in dead.json()["error"]["message"]
    t.join(timeout=30)
    assert result == [1]  # the server stopped by itself, with a failure status
    assert loop.dead is not None and "engine bug" in loop.dead
    from fastapi.testclient import TestClient

    health = TestClient(app).get("/health")
    assert health.status_code == 503 and "engine bug" in health.json()["error"]
