"""The function tools of the tool-calling tests (the unit tests of ``ds.inference.tools`` and the
end-to-end ``ds serve`` tests): OpenAI ``tools`` entries with JSON-schema parameters."""

from __future__ import annotations

import copy
from typing import Any

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 12},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
        },
    },
}
ADD: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def closed(tool: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``tool`` whose parameters allow no property beyond those listed."""
    out = copy.deepcopy(tool)
    out["function"]["parameters"]["additionalProperties"] = False
    return out
