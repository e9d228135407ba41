"""Tool calling in /v1/chat/completions: ``tools``, ``tool_choice``, ``parallel_tool_calls``.

Calls use the Hermes / Qwen format that most open chat templates write::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The tools reach the model through the chat template's ``tools`` variable, as transformers'
``apply_chat_template(tools=...)`` passes them; a template that does not use ``tools`` gets them
in a system message that describes this format (assistant ``tool_calls`` and ``tool`` results are
then written into the conversation in the same format). An xgrammar structural tag constrains
the output: under ``auto`` the model writes free text until it writes ``<tool_call>``, after which
the name must be one of the tools and the arguments must match that tool's JSON schema; under
``required`` (or a named function) the output is one or more calls and nothing else. ``none``
leaves the tools out of the prompt and the output alone. :class:`ToolCallParser` turns the text
back into OpenAI ``tool_calls``, incrementally for streams; a call cut off by ``max_tokens`` is
dropped, never returned as content.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from ds.inference.openai_errors import bad_request, needs_grammar
from ds.interfaces.errors import DsError

BEGIN = "<tool_call>"
END = "</tool_call>"
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_SYSTEM = (
    "You are a function calling AI model. You may call one or more functions to assist with "
    "the user query. Here are the available tools: <tools>\n{tools}\n</tools>\nFor each function "
    "call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n'
    "</tool_call>"
)


@dataclass(frozen=True)
class ToolPlan:
    choice: str  # "auto", "required" or "forced"
    names: tuple[str, ...]
    grammar: Any  # the compiled structural tag


def _tools_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    v = body.get("tools")
    if not isinstance(v, list) or not v:
        raise bad_request("tools", "expected a non-empty list of {'type': 'function', ...}")
    out, seen = [], set()
    for i, tool in enumerate(v):
        where = f"tools[{i}]"
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise bad_request(where, "expected {'type': 'function', 'function': {'name': ...}}")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise bad_request(
                f"{where}.function.name", "expected 1-64 letters, digits, '_', '.' or '-'"
            )
        if name in seen:
            raise bad_request(f"{where}.function.name", f"{name!r} is defined twice")
        seen.add(name)
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise bad_request(f"{where}.function.parameters", "expected a JSON schema object")
        out.append({"type": "function", "function": {**fn, "parameters": params}})
    return out


def _choice_of(body: dict[str, Any], names: list[str]) -> tuple[str, list[str]]:
    """(mode, the tools it allows): mode is none, auto, required or forced."""
    v = body.get("tool_choice", "auto")
    if v in ("none", "auto", "required"):
        return str(v), names
    fn = v.get("function") if isinstance(v, dict) else None
    if not isinstance(v, dict) or v.get("type") != "function" or not isinstance(fn, dict):
        raise bad_request(
            "tool_choice",
            "expected 'none', 'auto', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}",
        )
    if fn.get("name") not in names:
        raise bad_request(
            "tool_choice", f"names the function {fn.get('name')!r}, which is not in tools {names}"
        )
    return "forced", [str(fn["name"])]


def _tag(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool["function"]
    return {
        "type": "tag",
        "begin": f'{BEGIN}\n{{"name": "{fn["name"]}", "arguments": ',
        # at most one blank in a row, so that a weak model cannot wander in whitespace
        "content": {
            "type": "json_schema",
            "json_schema": fn["parameters"],
            "max_whitespace_cnt": 1,
        },
        "end": "}\n" + END,
    }


def structural_tag(tools: list[dict[str, Any]], mode: str, parallel: bool) -> dict[str, Any]:
    """The xgrammar structural tag of ``tools`` under tool_choice ``mode``."""
    tags = [_tag(t) for t in tools]
    fmt: dict[str, Any]
    if mode == "forced":
        fmt = tags[0]
    elif mode == "required":
        fmt = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "\n",
            "at_least_one": True,
            "stop_after_first": not parallel,
        }
    else:
        fmt = {
            "type": "triggered_tags",
            "triggers": [BEGIN],
            "tags": tags,
            "stop_after_first": not parallel,
        }
    return {"type": "structural_tag", "format": fmt}


def _with_arguments_objects(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant ``tool_calls`` with their JSON-string arguments as objects, the shape chat
    templates index into (as vLLM and transformers pass them)."""
    out = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and calls:
            if not isinstance(calls, list):
                raise bad_request(f"messages[{i}].tool_calls", "expected a list")
            m = {**m, "tool_calls": [_call_for_template(c, i) for c in calls]}
        out.append(m)
    return out


def _call_for_template(call: Any, i: int) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request(f"messages[{i}].tool_calls", "expected {'function': {'name': ...}}")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            raise bad_request(
                f"messages[{i}].tool_calls", "function.arguments is not valid JSON"
            ) from None
    return {**call, "function": {**fn, "arguments": args}}


def _inline(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For a template without ``tools``: the tools in a system message, calls and results in
    the conversation as text."""
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    system = _SYSTEM.format(tools=listing)
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            blocks = [
                f"{BEGIN}\n{json.dumps(c['function'], ensure_ascii=False)}\n{END}"
                for c in m["tool_calls"]
            ]
            text = "\n".join(filter(None, [m.get("content") or "", *blocks]))
            m = {"role": "assistant", "content": text}
        elif m.get("role") == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
        out.append(m)
    if out and out[0].get("role") == "system":
        return [{**out[0], "content": f"{out[0]['content']}\n\n{system}"}, *out[1:]]
    return [{"role": "system", "content": system}, *out]


def plan_tools(
    body: dict[str, Any], messages: list[dict[str, Any]], codec: Any, grammar: Any
) -> tuple[list[dict[str, Any]], dict[str, Any], ToolPlan | None]:
    """(messages to render, extra template variables, the plan or None without tools)."""
    messages = _with_arguments_objects(messages)
    if body.get("tools") is None:
        if body.get("tool_choice") not in (None, "none", "auto"):
            raise bad_request("tool_choice", "needs 'tools'")
        return messages, {}, None
    tools = _tools_of(body)
    names = [t["function"]["name"] for t in tools]
    mode, allowed = _choice_of(body, names)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad_request("parallel_tool_calls", f"expected a boolean, got {json.dumps(parallel)}")
    if mode == "none":
        return messages, {}, None
    if grammar is None or not hasattr(grammar, "structural_tag"):
        raise needs_grammar("tool calling", "tools")
    chosen = [t for t in tools if t["function"]["name"] in allowed]
    try:
        # Free text and further calls end at the model's stop token; one call ends the output.
        until_stop = mode == "auto" or (mode == "required" and parallel)
        compiled = grammar.structural_tag(structural_tag(chosen, mode, parallel), until_stop)
    except DsError as exc:
        raise bad_request("tools", str(exc)) from exc
    plan = ToolPlan(mode, tuple(allowed), compiled)
    if codec.uses_tools:
        return messages, {"tools": tools}, plan
    return _inline(messages, tools), {}, plan


# -- output -----------------------------------------------------------------------------------
@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON string, as OpenAI sends it
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))

    def json(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {} if index is None else {"index": index}
        out.update(
            {
                "id": self.id,
                "type": "function",
                "function": {"name": self.name, "arguments": self.arguments},
            }
        )
        return out


def _call_of(block: str) -> ToolCall | None:
    try:
        value = json.loads(block)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", value.get("parameters", {}))
    return ToolCall(value["name"], json.dumps(args, ensure_ascii=False))


class ToolCallParser:
    """Splits generated text into message content and tool calls, as the text arrives.

    ``feed`` returns (content released, calls completed); content that could be the start of
    ``<tool_call>`` is held back and whitespace around calls is dropped. A call left unfinished
    when the output ends (cut by ``max_tokens`` or a stop string) is dropped, never returned as
    content: ``dropped`` says so."""

    def __init__(self) -> None:
        self._buf = ""
        self._in_call = False
        self._blank = ""  # whitespace held until text follows it
        self.calls: list[ToolCall] = []
        self.content = ""
        self.dropped = False  # an unfinished call was left out at the end

    def _text(self, text: str) -> str:
        # Trailing whitespace waits for text after it: before a call it is dropped.
        text = self._blank + text
        body = text.rstrip()
        self._blank = text[len(body) :]
        self.content += body
        return body

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._buf += text
        released, calls = "", []
        while self._buf:
            if self._in_call:
                end = self._buf.find(END)
                if end < 0:
                    break
                call = _call_of(self._buf[:end])
                if call is None:  # not a call after all: keep it as text
                    released += self._text(BEGIN + self._buf[: end + len(END)])
                else:
                    calls.append(call)
                self._buf = self._buf[end + len(END) :]
                self._in_call = False
                continue
            start = self._buf.find(BEGIN)
            if start >= 0:
                released += self._text(self._buf[:start])
                self._buf = self._buf[start + len(BEGIN) :]
                self._in_call = True
                continue
            keep = next(
                (
                    k
                    for k in range(min(len(BEGIN) - 1, len(self._buf)), 0, -1)
                    if BEGIN.startswith(self._buf[-k:])
                ),
                0,
            )
            released += self._text(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            break
        self.calls += calls
        return released, calls

    def finish(self, cut: bool = False) -> str:
        """The content still held back, at the end of the output (trailing whitespace too, when
        the output called no tool and dropped nothing). An unfinished call is dropped; so is a
        held-back start of ``<tool_call>`` when ``cut`` (the output ran out of tokens, so that
        it may have been a call)."""
        rest = self._buf
        if self._in_call or (cut and rest):
            self.dropped, rest = True, ""
        self._buf, self._in_call = "", False
        out = self._text(rest)
        if not self.calls and not self.dropped:
            out, self.content, self._blank = out + self._blank, self.content + self._blank, ""
        return out
