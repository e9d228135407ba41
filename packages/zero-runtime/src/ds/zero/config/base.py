"""The base of every config section: strict keys, and DeepSpeed's reading of "auto"."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, model_validator

from ds.zero.config.types import STRICT


def _takes_auto(model: type[BaseModel], key: str) -> bool:
    for name, info in model.model_fields.items():
        choices = getattr(info.validation_alias, "choices", ()) or ()
        if key == name or key in choices:
            return "'auto'" in str(info.annotation) or name in getattr(model, "AUTO_IS_VALUE", ())
    return False  # DeepSpeed drops any key set to "auto", even one its model does not have


def drop_autos(model: type[BaseModel], data: Any) -> Any:
    """DeepSpeed's models treat "auto" as "use the default" wherever no framework filled it;
    ds does the same for every field that does not itself take "auto"."""
    if not isinstance(data, dict) or getattr(model, "RAW_AUTO", False):
        return data
    return {k: v for k, v in data.items() if v != "auto" or _takes_auto(model, k)}


class Section(BaseModel):
    """Sections DeepSpeed reads without a model (the top level, optimizer, aio, ...) set
    ``RAW_AUTO = True``: an "auto" there reaches DeepSpeed as the string, not as the default."""

    model_config = STRICT

    @model_validator(mode="before")
    @classmethod
    def _auto_is_default(cls, data: Any) -> Any:
        return drop_autos(cls, data)
