"""Field types shared by the config models: integers written as ``1e9``, and ``"auto"``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict


def _integral(value: Any) -> Any:
    # JSON has no integer literal for 5e8; DeepSpeed configs write buffer sizes that way, so an
    # integral float (or the string "1e9") is accepted where an integer is expected.
    if isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value != "auto":
        try:
            number = float(value)
        except ValueError:
            return value
        if number.is_integer():
            return int(number)
    return value


Int = Annotated[int, BeforeValidator(_integral)]
Auto = Literal["auto"]
IntOrAuto = Annotated[int | Auto, BeforeValidator(_integral)]
FloatOrAuto = float | Auto

# Every section forbids unknown keys and accepts fields by name or by alias.
STRICT = ConfigDict(extra="forbid", populate_by_name=True, validate_default=True, frozen=False)
