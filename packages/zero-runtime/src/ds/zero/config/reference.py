"""The config reference in docs/training.md, generated from the models (so the two cannot drift).

python -m ds.zero.config.reference > reference.md
"""

from __future__ import annotations

import sys
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from ds.zero.config.model import DsConfig
from ds.zero.config.sections import OPTIMIZER_PARAMS, SCHEDULER_PARAMS
from ds.zero.config.unimplemented import TOP_LEVEL, ZERO_KEYS_DEFAULTS

BEGIN = "<!-- config-reference:begin -->"
END = "<!-- config-reference:end -->"


def _type_name(annotation: Any) -> str:
    text = str(annotation)
    if isinstance(annotation, type):
        text = annotation.__name__
    for noise in (
        "typing.",
        "Annotated[",
        "ds.zero.config.sections_aux.",
        "ds.zero.config.sections.",
        "ds.zero.config.sections_zero.",
        "ds.zero.config.sections_optim.",
        "ds.zero.config.types.",
    ):
        text = text.replace(noise, "")
    text = text.replace("NoneType", "null").replace("Literal", "")
    if "BeforeValidator" in text:
        text = text.split(",", 1)[0]
        text = 'int | "auto"' if "auto" in str(annotation) else "int"
    return text.replace("|", "\\|")


def _default(field: Any) -> str:
    if field.default is not PydanticUndefined:
        value = field.default
        if isinstance(value, BaseModel):
            return "{}"
        return f"`{value!r}`" if value is not None else "`null`"
    if field.default_factory is not None:
        return "{}"
    return "(see aliases)"


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows: list[str] = []
    unimplemented = TOP_LEVEL if model is DsConfig else set()
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        choices = [
            str(c) for c in (getattr(field.validation_alias, "choices", ()) or ()) if c != name
        ]
        notes = []
        if choices:
            notes.append("also " + ", ".join(f"`{c}`" for c in choices))
        if name in unimplemented or (prefix == "zero_optimization." and name in ZERO_KEYS_DEFAULTS):
            notes.append("accepted, not acted on (warns)")
        if field.description:
            notes.append(field.description)
        rows.append(
            f"| `{key}` | {_type_name(field.annotation)} | {_default(field)} | {'; '.join(notes)} |"
        )
        sub = _submodel(field.annotation)
        if sub is not None:
            rows.extend(_rows(sub, f"{key}."))
    return rows


def _submodel(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def markdown() -> str:
    lines = [BEGIN, "", "| key | type | default | notes |", "|---|---|---|---|"]
    lines += _rows(DsConfig, "")
    lines += ["", "Optimizer `params` by `optimizer.type` (case-insensitive):", ""]
    for kind, keys in OPTIMIZER_PARAMS.items():
        lines.append(f"- **{kind}**: " + ", ".join(f"`{k}`" for k in sorted(keys)))
    lines += ["", "Scheduler `params` by `scheduler.type`, with defaults:", ""]
    for kind, params in SCHEDULER_PARAMS.items():
        lines.append(f"- **{kind}**: " + ", ".join(f"`{k}`={v!r}" for k, v in params.items()))
    lines += ["", END]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown() + "\n")
