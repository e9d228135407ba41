"""Tool calling pieces: the xgrammar structural tags of each tool_choice (run by xgrammar
itself), the incremental tool-call parser, and the prompt a chat template renders with tools
(against transformers' apply_chat_template)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tool_schemas import ADD, WEATHER

from ds.inference.openai_errors import APIError
from ds.inference.tokenizer import TextCodec
from ds.inference.tools import ToolCallParser, plan_tools, structural_tag

xgr = pytest.importorskip("xgrammar")


def _call(name: str, args: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


PARIS = _call("get_weather", {"city": "Paris", "unit": "c"})
SUM = _call("add", {"a": 1, "b": 2})


def _accepts(mode: str, parallel: bool, text: str, tools: list[Any] | None = None) -> bool:
    from xgrammar.testing import _is_grammar_accept_string

    from ds.inference.grammar import without_control_chars

    tag = without_control_chars(structural_tag(tools or [WEATHER, ADD], mode, parallel))
    return bool(_is_grammar_accept_string(xgr.Grammar.from_structural_tag(json.dumps(tag)), text))


def test_auto_allows_text_or_calls_whose_arguments_match_the_schema() -> None:
    assert _accepts("auto", True, "It is sunny in Paris.")
    assert _accepts("auto", True, "Let me look.\n" + PARIS)
    assert _accepts("auto", True, PARIS + "\n" + SUM)
    assert not _accepts("auto", True, _call("get_weather", {"city": "Paris", "unit": "k"}))
    assert not _accepts("auto", True, _call("get_weather", {"city": "Paris"}))
    assert not _accepts("auto", True, _call("nope", {}))
    # A length-bounded string cannot hold raw control characters (they would not parse).
    assert not _accepts("auto", True, PARIS.replace("Paris", "Pa\x01ris"))
    assert not _accepts("auto", False, PARIS + "\n" + SUM)


def test_required_and_forced_allow_only_calls() -> None:
    assert not _accepts("required", True, "It is sunny.")
    assert _accepts("required", True, PARIS)
    assert _accepts("required", True, PARIS + "\n" + SUM)
    assert not _accepts("required", False, PARIS + "\n" + SUM)
    assert _accepts("forced", False, SUM, [ADD])
    assert not _accepts("forced", False, PARIS, [ADD])
    assert not _accepts("forced", False, "text " + SUM, [ADD])
    # Constrained from the first token: no leading blank or text, each call closed.
    for mode, parallel in (("required", True), ("required", False), ("forced", False)):
        tools = [ADD] if mode == "forced" else None
        for text in ("\n" + SUM, " " + SUM, "x" + SUM, SUM[:-1], SUM + "\n", SUM + " x"):
            assert not _accepts(mode, parallel, text, tools), (mode, text)
    assert not _accepts("required", True, SUM + "\n" + SUM[:-3])
    assert not _accepts("required", True, SUM + "\n\n" + SUM)


def _parse(pieces: list[str], cut: bool = False) -> tuple[str, list[tuple[str, Any]]]:
    parser = ToolCallParser()
    released = "".join(parser.feed(piece)[0] for piece in pieces)
    released += parser.finish(cut)
    assert released == parser.content  # what a stream sends is the unary content
    return parser.content, [(c.name, json.loads(c.arguments)) for c in parser.calls]


def test_the_parser_gives_the_same_calls_however_the_text_arrives() -> None:
    text = "Checking. " + PARIS + "\n" + SUM + "\n"
    whole = _parse([text])
    assert whole == (
        "Checking.",
        [("get_weather", {"city": "Paris", "unit": "c"}), ("add", {"a": 1, "b": 2})],
    )
    assert _parse(list(text)) == whole
    for cut in range(len(text)):
        assert _parse([text[:cut], text[cut:]]) == whole, cut
    # Content that only looks like the start of a call is released at the end.
    assert _parse(["a <tool_c", "all"]) == ("a <tool_call", [])
    assert _parse(["x <tool"]) == ("x <tool", [])
    # A finished block that is not JSON stays text.
    assert _parse(["<tool_call>oops</tool_call>"]) == ("<tool_call>oops</tool_call>", [])


def test_a_call_cut_off_leaves_no_markup_in_the_content() -> None:
    partial = '<tool_call>\n{"name": "add", "argu'
    for cut in (True, False):  # by max_tokens, or by a stop string
        assert _parse([partial], cut) == ("", [])
        assert _parse(["Let me add.\n", partial], cut) == ("Let me add.", [])
        # the calls finished before the cut stay; the separator and the partial call go
        assert _parse([SUM, "\n", partial], cut) == ("", [("add", {"a": 1, "b": 2})])
    # Every prefix of a call, cut by max_tokens, is no content and no call.
    for n in range(1, len(SUM)):
        parser = ToolCallParser()
        assert parser.feed("\n" + SUM[:n])[0] + parser.finish(cut=True) == "", n
        assert (parser.content, parser.calls, parser.dropped) == ("", [], True), n
    # Text that only looks like the start of a call is text at a stop token; cut by
    # max_tokens it may have been a call, and is dropped.
    assert _parse(["x <tool"], cut=True) == ("x", [])
    assert _parse(["x <tool"]) == ("x <tool", [])


# -- prompts -------------------------------------------------------------------------------------
TOOLS_TEMPLATE = (
    "{% if tools %}<|system|>Tools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}</s>"
    "{% endif %}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] or '' }}"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>{{ c['function']['name'] }} "
    "{{ c['function']['arguments'] | tojson }}</tool_call>{% endfor %}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
PLAIN_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}<|assistant|>"
)
CONVERSATION = [
    {"role": "user", "content": "weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
]


def _codec(template: str) -> tuple[TextCodec, Any]:
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "x": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=template)
    return TextCodec(tok, template), hf


class _Grammar:
    """Compiles structural tags the way ds serve's compiler does, without a vocabulary."""

    def structural_tag(self, tag: dict[str, Any], until_stop: bool) -> Any:
        return xgr.Grammar.from_structural_tag(json.dumps(tag))


def _render(codec: TextCodec, body: dict[str, Any]) -> str:
    messages, extra, plan = plan_tools(body, body["messages"], codec, _Grammar())
    assert plan is not None
    return codec.chat_prompt(messages, **extra)


def test_a_template_with_tools_renders_as_transformers_does() -> None:
    codec, hf = _codec(TOOLS_TEMPLATE)
    assert codec.uses_tools
    body = {"messages": CONVERSATION, "tools": [WEATHER, ADD]}
    # transformers takes the call's arguments as an object; OpenAI clients send a JSON string.
    as_objects = json.loads(json.dumps(CONVERSATION))
    as_objects[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris", "unit": "c"}
    want = hf.apply_chat_template(
        as_objects, tools=[WEATHER, ADD], add_generation_prompt=True, tokenize=False
    )
    assert _render(codec, body) == want
    assert '"name": "get_weather"' in want


def test_a_template_without_tools_gets_them_in_a_system_message() -> None:
    codec, _ = _codec(PLAIN_TEMPLATE)
    assert not codec.uses_tools
    text = _render(codec, {"messages": CONVERSATION, "tools": [WEATHER]})
    assert text.startswith("<|system|>You are a function calling AI model.")
    assert json.dumps(WEATHER) in text
    assert _call("get_weather", {"city": "Paris", "unit": "c"}) in text
    assert "<|user|><tool_response>\n21 C\n</tool_response></s><|assistant|>" in text
    # tool_choice none: no tools in the prompt, no grammar.
    messages, extra, plan = plan_tools(
        {"tools": [WEATHER], "tool_choice": "none"}, CONVERSATION[:1], codec, _Grammar()
    )
    assert plan is None and extra == {} and messages == CONVERSATION[:1]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
            "'x'",
        ),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice", "'required'"),
        ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
        ({"tools": {"get_weather": {}}}, "tools", "list"),
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools[0].function.name",
            "letters",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "twice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
    ],
)
def test_bad_tool_requests_are_400(body: dict[str, Any], param: str, words: str) -> None:
    codec, _ = _codec(PLAIN_TEMPLATE)
    with pytest.raises(APIError) as err:
        plan_tools(body, CONVERSATION[:1], codec, _Grammar())
    assert err.value.status == 400 and err.value.param == param, err.value.message
    assert words in err.value.message


@pytest.mark.parametrize("arguments", ["{not json", "[" * 5000 + "]" * 5000])
def test_bad_arguments_of_earlier_calls_are_400(arguments: str) -> None:
    codec, _ = _codec(TOOLS_TEMPLATE)
    messages = json.loads(json.dumps(CONVERSATION))
    messages[1]["tool_calls"][0]["function"]["arguments"] = arguments
    with pytest.raises(APIError, match="not valid JSON") as err:
        plan_tools({"tools": [WEATHER]}, messages, codec, _Grammar())
    assert err.value.param == "messages[1].tool_calls"
