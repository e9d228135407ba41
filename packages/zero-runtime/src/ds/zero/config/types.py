"""Field types shared by the config models: integers written as ``1e9``, and ``"auto"``.

Inside sections the coercions are pydantic's lax ones, the same DeepSpeed's own models apply
(``5e8`` and ``"5"`` are integers, ``"1e9"`` and ``5.5`` are not), so both accept the same values.
DeepSpeed reads top-level scalars without a model and compares them with numbers, so a string
there fails in DeepSpeed; ``TopInt`` refuses it at load with the key named.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict


def _integral(value: Any) -> Any:
    # JSON has no integer literal for 5e8; DeepSpeed configs write buffer sizes that way, so an
    # integral float is accepted where an integer is expected (pydantic's lax rule, kept explicit).
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _no_string(value: Any) -> Any:
    if isinstance(value, str) and value != "auto":
        raise ValueError(f"must be a number, not the string {value!r}")
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not {value!r}")
    return _integral(value)


Int = Annotated[int, BeforeValidator(_integral)]
Auto = Literal["auto"]
IntOrAuto = Annotated[int | Auto, BeforeValidator(_integral)]
FloatOrAuto = float | Auto
# A top-level integer (batch sizes): a number or "auto", never a numeric string or a bool.
TopInt = Annotated[int, BeforeValidator(_no_string)]
TopIntOrAuto = Annotated[int | Auto, BeforeValidator(_no_string)]

# Every section forbids unknown keys and accepts fields by name or by alias.
STRICT = ConfigDict(extra="forbid", populate_by_name=True, validate_default=True, frozen=False)
