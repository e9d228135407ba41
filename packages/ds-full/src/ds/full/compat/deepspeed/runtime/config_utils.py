"""``deepspeed.runtime.config_utils``: the config helpers scripts and integrations call.

``DeepSpeedConfigModel`` is the pydantic base of ds's config sections (the one schema: ds's
models are DeepSpeed-JSON compatible) with DeepSpeed's deprecated-field convention: a field
declared with ``json_schema_extra={"deprecated": True, "new_param": "name", "new_param_fn": f}``
moves its value (through ``f``) to ``new_param`` with a warning, and giving both is an error.
The ``get_*_param`` readers and the duplicate-key hook behave as DeepSpeed's."""

from __future__ import annotations

import collections
import json
import logging
from typing import Any

from ds.interfaces.errors import ConfigError
from ds.zero.config.base import Section


class DeprecatedFieldError(ConfigError, AssertionError):
    """A deprecated config field and the field replacing it were both given."""


class DeepSpeedConfigModel(Section):
    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        for name, field in type(self).model_fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            if extra.get("deprecated") and name in self.model_fields_set:
                self._move_deprecated(name, extra)

    def _move_deprecated(self, name: str, extra: dict[str, Any]) -> None:
        new = str(extra.get("new_param", ""))
        note = f"; use {new!r} instead" if new else ""
        logging.getLogger("ds.deepspeed_compat").warning(
            f"config field {name!r} is deprecated{note} {extra.get('deprecated_msg', '')}".rstrip()
        )
        if not new or not extra.get("set_new_param", True):
            return
        *path, leaf = new.split(".")
        target: Any = self
        for part in path:
            target = getattr(target, part)
        if leaf in target.model_fields_set:
            raise DeprecatedFieldError(
                f"config fields {name!r} (deprecated) and {new!r} are both given; keep only {new!r}"
            )
        fn = extra.get("new_param_fn", lambda x: x)
        object.__setattr__(target, leaf, fn(getattr(self, name)))


def get_scalar_param(param_dict: dict[str, Any], param_name: str, param_default_value: Any) -> Any:
    return param_dict.get(param_name, param_default_value)


get_list_param = get_scalar_param
get_dict_param = get_scalar_param


def get_config_default(config: type[DeepSpeedConfigModel], field_name: str) -> Any:
    field = config.model_fields.get(field_name)
    if field is None:
        raise AttributeError(f"{config.__name__} has no field {field_name!r}")
    if field.is_required():
        raise ValueError(f"{config.__name__}.{field_name} is required and has no default")
    return field.get_default(call_default_factory=True)


def dict_raise_error_on_duplicate_keys(ordered_pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for json.load: a key given twice is an error naming it."""
    counts = collections.Counter(k for k, _ in ordered_pairs)
    dupes = sorted(k for k, n in counts.items() if n > 1)
    if dupes:
        raise ValueError(f"duplicate keys in the DeepSpeed config: {dupes}; keep one of each")
    return dict(ordered_pairs)


class ScientificNotationEncoder(json.JSONEncoder):
    """JSON with large numbers in scientific notation (1e+09 rather than 1000000000)."""

    def iterencode(self, o: Any, _one_shot: bool = False) -> Any:
        if isinstance(o, bool) or o is None:
            return super().iterencode(o, _one_shot)
        if isinstance(o, (int, float)) and abs(o) >= 1e3:
            return iter([f"{o:e}"])
        if isinstance(o, dict):
            inner = ", ".join(f'"{k}": ' + "".join(self.iterencode(v)) for k, v in o.items())
            return iter(["{" + inner + "}"])
        if isinstance(o, (list, tuple)):
            return iter(["[" + ", ".join("".join(self.iterencode(v)) for v in o) + "]"])
        return super().iterencode(o, _one_shot)


class DeepSpeedConfigObject:
    """Objects that print as their attributes' JSON."""

    def repr(self) -> dict[str, Any]:
        return self.__dict__

    def __repr__(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True, indent=4, cls=ScientificNotationEncoder)


__all__ = [
    "DeepSpeedConfigModel",
    "DeepSpeedConfigObject",
    "ScientificNotationEncoder",
    "dict_raise_error_on_duplicate_keys",
    "get_config_default",
    "get_dict_param",
    "get_list_param",
    "get_scalar_param",
]
