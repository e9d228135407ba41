"""The real-model tier: SmolLM2-135M-Instruct as llama.cpp users bring it (a Q4_1 GGUF from the
package index). ds loads the file, generates greedily what transformers generates on the same
dequantized weights, and `ds serve model.gguf` answers the `openai` client's chat."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import hf_greedy

sys.path.insert(0, str(Path(__file__).parent))
from real_model import smollm2_gguf

pytest.importorskip("gguf")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.realmodel, pytest.mark.slow, pytest.mark.timeout(900)]

QUESTIONS = ["What is the capital of France?", "Name three primary colors."]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return smollm2_gguf()


@pytest.fixture(scope="module")
def loaded(gguf_path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from ds.inference.gguf_file import read_gguf

    return read_gguf(gguf_path)


@pytest.fixture(scope="module")
def codec(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from ds.inference.gguf_file import open_gguf
    from ds.inference.gguf_tokenizer import write_tokenizer_dir
    from ds.inference.tokenizer import TextCodec

    directory = tmp_path_factory.mktemp("smollm2-tokenizer")
    return TextCodec.from_dir(write_tokenizer_dir(open_gguf(gguf_path), directory))


def test_gguf_loads_as_the_134m_llama(loaded: tuple[dict[str, Any], dict[str, Any]]) -> None:
    config, weights = loaded
    assert config["model_type"] == "llama"
    assert (config["num_hidden_layers"], config["hidden_size"]) == (30, 576)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
    assert round(sum(w.numel() for w in weights.values()) / 1e6, 1) == 134.5


def test_chat_template_and_tokenizer_from_the_file(codec: Any) -> None:
    ids = codec.chat_ids([{"role": "user", "content": QUESTIONS[0]}])
    text = codec.chat_prompt([{"role": "user", "content": QUESTIONS[0]}])
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert codec.decode(ids) == text.replace("<|im_start|>", "").replace("<|im_end|>", "")
    assert codec.special["eos_token"] == "<|im_end|>"


def _hf_model(config: dict[str, Any], weights: dict[str, torch.Tensor]) -> Any:
    """transformers' Llama holding the weights ds dequantized (no random init first)."""
    import contextlib

    import transformers

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers
        no_init_weights = contextlib.nullcontext
    with no_init_weights():
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    model.tie_weights()
    return model.eval()


def test_greedy_equals_transformers_on_the_same_dequantized_weights(
    loaded: tuple[dict[str, Any], dict[str, torch.Tensor]], codec: Any
) -> None:
    from ds.inference import SamplingParams, build_engine, generate

    config, weights = loaded
    prompts = [codec.chat_ids([{"role": "user", "content": q}]) for q in QUESTIONS]
    hf = _hf_model(config, weights)
    want = [hf_greedy(hf, p, NEW_TOKENS, eos_token_id=config["eos_token_id"]) for p in prompts]
    # The engine shares transformers' tensors (the file's own route is the server test's).
    engine = build_engine(hf, {"kv_cache": {"block_size": 16, "num_blocks": 64}})
    got = generate(engine, prompts, SamplingParams(max_new_tokens=NEW_TOKENS), stop_at_eos=True)
    assert [r.tokens for r in got] == want
    assert "Paris" in codec.decode(got[0].tokens)


@pytest.fixture(scope="module")
def server(gguf_path: Path) -> Iterator[Any]:
    from serve_harness import MODEL, running_server

    pytest.importorskip("fastapi")
    yield from running_server(
        gguf_path, "--served-model-name", MODEL, "--block-size", "16", "--num-blocks", "128"
    )


@pytest.mark.multiprocess
def test_ds_serve_gguf_answers_the_openai_client(server: Any) -> None:
    from serve_harness import MODEL

    messages = [{"role": "user", "content": QUESTIONS[0]}]
    reply = server.client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0
    )
    answer = reply.choices[0].message.content
    assert "Paris" in answer, answer
    stream = server.client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == answer


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.mark.multiprocess
def test_ds_serve_gguf_calls_a_named_tool_with_schema_arguments(server: Any) -> None:
    import json

    from serve_harness import MODEL

    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    reply = server.client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], tool_choice=named, max_tokens=40,
        temperature=0,
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    plain = server.client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=12,
        temperature=0,
    )  # fmt: skip
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content


@pytest.mark.multiprocess
def test_ds_serve_gguf_required_tool_call_cut_by_max_tokens_leaks_no_markup(server: Any) -> None:
    import json

    from serve_harness import MODEL

    def ask(max_tokens: int, **kw: Any) -> Any:
        return server.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[WEATHER], tool_choice="required", max_tokens=max_tokens, temperature=0, **kw,
        )  # fmt: skip

    # Cut inside the first call: no content, no call; cut inside a second: the first stays.
    for max_tokens in (3, 20, 40):
        choice = ask(max_tokens).choices[0]
        assert choice.finish_reason == "length", (max_tokens, choice)
        assert choice.message.content is None, (max_tokens, choice)
        calls = choice.message.tool_calls or []
        assert all(json.loads(c.function.arguments) == {"city": "Paris"} for c in calls)
    streamed = list(ask(40, stream=True))
    assert not "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    # With max_tokens to spare the output is whole calls and nothing else.
    for kw in ({"parallel_tool_calls": False}, {}):
        choice = ask(80, **kw).choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert choice.message.tool_calls, kw
        for call in choice.message.tool_calls:
            assert call.function.name == "get_weather"
            assert json.loads(call.function.arguments) == {"city": "Paris"}
