"""Tool calling through the real `openai` client against a real `ds serve`: required and named
choices give calls whose arguments match each function's schema (the grammar forces a valid call
from a random model), parallel calls, streamed tool_calls deltas equal to the unary answer, text
under auto and none, a conversation carrying calls and results, and bad tool requests as 400s
that leave the server healthy."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serve_harness import MODEL, Server, check_error, openai, running_server
from serve_model import make_model_dir
from tool_schemas import ADD, WEATHER, closed

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("fastapi")
pytest.importorskip("xgrammar")

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(600)]

TOOLS = [closed(WEATHER), closed(ADD)]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model_dir = make_model_dir(tmp_path_factory.mktemp("tools"), MODEL)
    yield from running_server(model_dir, "--block-size", "16", "--num-blocks", "256")


@pytest.fixture(scope="module")
def eos(server: Server) -> int:
    return int(json.loads((server.model_dir / "config.json").read_text())["eos_token_id"])


def _valid_calls(message: Any) -> list[tuple[str, Any]]:
    """(name, arguments) of each call, checked against its function's schema."""
    out = []
    for call in message.tool_calls or []:
        assert call.type == "function" and call.id.startswith("call_")
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        out.append((call.function.name, args))
    return out


def _ask(server: Server, choice: Any, **kw: Any) -> Any:
    """The client's answer to ASK with TOOLS under ``tool_choice=choice``."""
    return server.client.chat.completions.create(
        model=MODEL,
        messages=ASK,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice=choice,
        **kw,
    )


def test_required_and_named_choices_call_with_valid_arguments(server: Server) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        for seed in range(4):
            out = _ask(
                server,
                choice,
                temperature=1.0,
                seed=seed,
                max_tokens=200,
                parallel_tool_calls=False,
            )
            c = out.choices[0]
            calls = _valid_calls(c.message)
            assert c.finish_reason == "tool_calls" and len(calls) >= 1, c
            assert c.message.content is None
            if choice is named:
                assert {name for name, _ in calls} == {"get_weather"}


def test_parallel_calls_and_parallel_tool_calls_false(server: Server, eos: int) -> None:
    # With EOS ruled out the grammar makes the model go on after its first call: another call
    # when parallel calls are allowed, the end of the output when they are not.
    body: dict[str, Any] = {
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 150,
        "logit_bias": {str(eos): -100},
    }
    many = server.client.chat.completions.create(model=MODEL, **body)
    assert len(_valid_calls(many.choices[0].message)) >= 2
    ids = [c.id for c in many.choices[0].message.tool_calls or []]
    assert len(set(ids)) == len(ids)
    one = server.client.chat.completions.create(model=MODEL, parallel_tool_calls=False, **body)
    assert len(_valid_calls(one.choices[0].message)) == 1
    assert one.choices[0].finish_reason == "tool_calls"


def test_calls_cut_off_by_max_tokens_leave_no_markup(server: Server, eos: int) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    for choice in ("required", named):
        for max_tokens in (1, 4, 9, 17, 30, 60):
            out = _ask(
                server, choice, temperature=0, max_tokens=max_tokens,
                logit_bias={str(eos): -100},
            )  # fmt: skip
            c = out.choices[0]
            # finished calls stay (valid, whole); the partial one is neither content nor call
            _valid_calls(c.message)
            assert c.message.content is None, (choice, max_tokens, c)
            assert c.finish_reason in ("length", "tool_calls"), (choice, max_tokens, c)
            if c.finish_reason == "length" and choice is named:
                assert c.message.tool_calls is None


def test_streamed_tool_calls_equal_the_unary_answer(server: Server, eos: int) -> None:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": "required",
        "temperature": 0.9,
        "seed": 3,
        "max_tokens": 150,
        "logit_bias": {str(eos): -100},
    }
    # Parallel calls until max_tokens: raw deltas carry each finished call once, whole, with its
    # index, id and type; the call cut off is dropped, in the stream as in the unary answer.
    unary = server.client.chat.completions.create(**body)
    assert unary.choices[0].finish_reason == "length"
    assert unary.choices[0].message.content is None
    chunks = list(server.client.chat.completions.create(stream=True, **body))
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    deltas = [call for chunk in chunks for call in chunk.choices[0].delta.tool_calls or []]
    assert [d.index for d in deltas] == list(range(len(deltas)))
    assert all(d.id and d.type == "function" for d in deltas)
    streamed = [(d.function.name, json.loads(d.function.arguments)) for d in deltas]  # type: ignore[union-attr, arg-type]
    assert streamed == _valid_calls(unary.choices[0].message) and len(streamed) >= 2
    # One call: the client's stream helper assembles the deltas (and rejects malformed ones).
    body["parallel_tool_calls"] = False
    unary = server.client.chat.completions.create(**body)
    with server.client.chat.completions.stream(**body) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert _valid_calls(final.choices[0].message) == _valid_calls(unary.choices[0].message)
    assert final.choices[0].finish_reason == "tool_calls"


def test_auto_and_none_answer_in_text(server: Server) -> None:
    plain = server.client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        temperature=0,
        max_tokens=12,  # type: ignore[arg-type]
    )
    for choice in ("auto", "none"):
        out = _ask(server, choice, temperature=0, max_tokens=12)
        c = out.choices[0]
        assert c.message.tool_calls is None and isinstance(c.message.content, str)
        assert c.finish_reason in ("stop", "length")
    # none leaves the tools out of the prompt: the answer is the one without tools.
    assert c.message.content == plain.choices[0].message.content


def test_a_conversation_with_calls_and_results(server: Server) -> None:
    first = _ask(server, "required", temperature=0, max_tokens=150)
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    messages = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "21 degrees"},
    ]
    again = server.client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=8,
    )
    assert again.choices[0].message.role == "assistant"
    assert again.usage is not None and again.usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]


BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {
                            "type": "object",
                            "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}},
                        },
                    },
                }
            ]
        },
        "tools",
        "minimum greater than maximum",
    ),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"a": {"type": "nonsense"}}},
                    },
                }
            ]
        },
        "tools",
        "nonsense",
    ),
    ({"tools": "get_weather"}, "tools", "list"),
    ({"response_format": {"type": "json_object"}}, "response_format", "tools"),
    ({"functions": [{"name": "f"}]}, "functions", "tools"),
]


def test_bad_tool_requests_are_400_and_the_server_stays_up(server: Server) -> None:
    for extra, param, word in BAD:
        body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 4, **extra}
        check_error(server.post("/v1/chat/completions", body), 400, param, word)
    with pytest.raises(openai.BadRequestError, match="nope"):
        _ask(server, {"type": "function", "function": {"name": "nope"}})
    assert server.http.get("/health").json()["status"] == "ok"
    out = server.chat(
        messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=150
    )
    assert out["choices"][0]["finish_reason"] == "tool_calls"
