"""Loading a config (path, dict or JSON string) into one validated model, with one error report."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ds.interfaces.errors import ConfigError
from ds.zero.config.lenient import prepare
from ds.zero.config.model import DsConfig, ResolvedConfig
from ds.zero.config.notices import UnimplementedConfigWarning
from ds.zero.config.suggest import closest
from ds.zero.config.unimplemented import (
    NESTED_DEFAULTS,
    STAGE3_DEFAULTS,
    TOP_LEVEL,
    ZERO_KEYS_DEFAULTS,
)

__all__ = ["UnimplementedConfigWarning", "load_config", "resolve"]

ConfigSource = str | os.PathLike[str] | Mapping[str, Any] | DsConfig


def load_config(source: ConfigSource) -> DsConfig:
    """Validate a config given as a path to a JSON file, a dict, a JSON string or a DsConfig.

    Every problem is reported in one :class:`ConfigError`, each line naming its dotted key.
    """
    if isinstance(source, DsConfig):
        return source
    prepared = prepare(_read(source), lambda path: _known_keys(DsConfig, path))
    data = prepared.data
    lines = list(prepared.problems) + _deepspeed_writer(data, prepared.ignored)
    cfg: DsConfig | None = None
    try:
        cfg = DsConfig.model_validate(data)
    except ValidationError as exc:
        lines += _lines(exc)
    if lines:
        raise ConfigError(_headed("invalid ds config", lines) + _ignored_note(prepared.ignored))
    assert cfg is not None
    cfg._ignored = list(prepared.ignored)
    if prepared.ignored:
        warnings.warn(
            "DeepSpeed ignores these config keys and so does ds: " + "; ".join(prepared.ignored),
            UnimplementedConfigWarning,
            stacklevel=2,
        )
    _warn_unimplemented(data)
    return cfg


def _deepspeed_writer(data: dict[str, Any], ignored: list[str]) -> list[str]:
    """DeepSpeed's ``checkpoint.writer`` is a block (``{"type": "FAST", ...}``); ds's is the name
    of its writer ("python" or "aio"). DeepSpeed's block is checked as DeepSpeed checks it, then
    set aside with a warning: ds writes with its default writer."""
    ckpt = data.get("checkpoint")
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("writer"), dict):
        return []
    from ds.zero.config.sections import CheckpointWriterConfig

    block = ckpt.pop("writer")
    try:
        CheckpointWriterConfig.model_validate(block)
    except ValidationError as exc:
        return [f"checkpoint.writer.{line}" for line in _lines(exc)]
    ignored.append(
        "checkpoint.writer (DeepSpeed's writer block; accepted, not acted on: ds writes with "
        "checkpoint.writer='python' unless set to 'python' or 'aio')"
    )
    return []


def _ignored_note(ignored: list[str]) -> str:
    # A misspelt key is ignored (as DeepSpeed ignores it), and the problem shows up elsewhere
    # ("set train_batch_size"): name the ignored keys so the cause is on screen.
    if not ignored:
        return ""
    return "\n  ignored (unknown) keys, as DeepSpeed ignores them: " + "; ".join(ignored)


def _headed(head: str, lines: list[str]) -> str:
    count = len(lines)
    return f"{head}: {count} problem{'s' if count != 1 else ''}\n  - " + "\n  - ".join(lines)


def _read(source: ConfigSource) -> dict[str, Any]:
    if isinstance(source, Mapping):
        return dict(source)
    text = os.fspath(source)
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            data = json.loads(text, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config JSON string is malformed: {exc}") from None
    else:
        path = Path(text)
        if not path.is_file():
            raise ConfigError(
                f"config file {text!r} does not exist; pass a path to a JSON file, a dict or a "
                "JSON string"
            )
        data = _read_file(path)
    if not isinstance(data, dict):
        raise ConfigError(f"a config must be a JSON object, got {type(data).__name__}")
    return data


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A key given twice silently keeps the last value in plain JSON; DeepSpeed refuses it, and a
    # duplicated section is almost always an edit that went wrong.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"config key {key!r} is given twice; keep one")
        out[key] = value
    return out


def _read_file(path: Path) -> Any:
    """JSON, or HJSON (DeepSpeed reads config files with hjson: comments, unquoted keys) when the
    file is not JSON and the hjson package is installed."""
    text = path.read_text()
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        error = exc
    try:
        import hjson  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigError(
            f"config file {str(path)!r} is not valid JSON: {error} (an HJSON config needs the "
            "hjson package: pip install hjson)"
        ) from None
    try:
        return hjson.loads(text, object_pairs_hook=_unique_keys)
    except hjson.HjsonDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is neither JSON nor HJSON: {exc}") from None


def _known_keys(model: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    current: type[BaseModel] | None = model
    for part in path:
        if current is None:
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            for candidate in current.model_fields.values():
                choices = getattr(candidate.validation_alias, "choices", ()) or ()
                if part in choices or candidate.alias == part:
                    field = candidate
                    break
        if field is None:
            return []
        current = _model_of(field.annotation)
    if current is None:
        return []
    keys: list[str] = []
    for name, field in current.model_fields.items():
        keys.append(field.alias or name)
        keys.extend(str(c) for c in (getattr(field.validation_alias, "choices", ()) or ()))
        keys.append(name)
    if current is DsConfig:
        keys.append("bfloat16")
    return sorted(set(keys))


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _lines(exc: ValidationError) -> list[str]:
    lines: list[str] = []
    seen: set[str] = set()
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        # Union members each report the same bad value; keep the first line per key.
        clean = tuple(
            p
            for p in loc
            if not (
                isinstance(p, str)
                and (
                    p in ("int", "float", "bool", "str", "none")
                    or p.startswith(("literal[", "function-", "dict[", "list["))
                )
            )
        )
        key = ".".join(str(p) for p in clean) or "<top level>"
        kind = err["type"]
        if kind == "extra_forbidden":
            hint = closest(str(clean[-1]), _known_keys(DsConfig, clean[:-1]))
            where = ".".join(str(p) for p in clean[:-1]) or "the top level"
            line = f"{key}: unknown key in {where}{hint}"
        else:
            msg = str(err["msg"]).removeprefix("Value error, ")
            value = err.get("input")
            shown = "" if isinstance(value, dict) else f" (got {value!r})"
            # A cross-section check names its keys itself.
            line = f"{key}: {msg}{shown}" if clean else msg
        if key in seen and kind != "extra_forbidden":
            continue
        seen.add(key)
        lines.append(line)
    return lines


def _warn_unimplemented(data: Mapping[str, Any]) -> None:
    names: list[str] = []
    for key in sorted(TOP_LEVEL & set(data)):
        value = data[key]
        if value in (None, False) or (isinstance(value, dict) and value.get("enabled") is False):
            continue
        names.append(key)
    zero = data.get("zero_optimization") or {}
    if isinstance(zero, dict):
        for key, default in ZERO_KEYS_DEFAULTS.items():
            if key in zero and zero[key] != default:
                names.append(f"zero_optimization.{key}")
    nested = dict(NESTED_DEFAULTS)
    if isinstance(zero, dict) and str(zero.get("stage", 0)) == "3":
        nested.update(STAGE3_DEFAULTS)
    for path, default in nested.items():
        node: Any = data
        for part in path:
            node = node.get(part, default) if isinstance(node, dict) else default
        if node != default:
            names.append(".".join(path))
    if names:
        warnings.warn(
            "ds accepts but does not act on these DeepSpeed config keys yet: "
            + ", ".join(names)
            + "; training proceeds without them",
            UnimplementedConfigWarning,
            stacklevel=3,
        )


def resolve(cfg: DsConfig, world_size: int, *, hidden_size: int | None = None) -> ResolvedConfig:
    """Resolve the batch triad and "auto" values for ``world_size`` data-parallel ranks."""
    problems: list[str] = []
    for key in (
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
    ):
        if getattr(cfg, key) == "auto":
            # DeepSpeed fails on an unfilled "auto" here; only a framework integration fills it.
            problems.append(
                f"{key}: 'auto' is filled by a framework integration (HF Trainer) and none did; "
                "set a number or remove the key"
            )
    train, micro, gas = _triad(cfg, world_size, problems)
    clip = cfg.gradient_clipping
    if clip == "auto":
        problems.append(
            "gradient_clipping: 'auto' is filled by a framework integration (HF Trainer); none "
            "did, so set a number (0 disables clipping)"
        )
        clip = 0.0
    buckets: dict[str, int] = {}
    for key in ("reduce_bucket_size", "allgather_bucket_size"):
        value = getattr(cfg.zero_optimization, key)
        if value == "auto":
            # As transformers fills it from the model's hidden size; without one, DeepSpeed's
            # default (it reads an unfilled "auto" as the default).
            value = hidden_size * hidden_size if hidden_size is not None else 500_000_000
        buckets[key] = int(value)
    if cfg.optimizer is not None:
        for key in [k for k, v in cfg.optimizer.params.items() if v == "auto"]:
            problems.append(
                f"optimizer.params.{key}: 'auto' but nothing filled it; set a number (framework "
                "integrations such as the HF Trainer fill it from their own arguments)"
            )
    if cfg.scheduler is not None:
        for key in [k for k, v in cfg.scheduler.params.items() if v == "auto"]:
            problems.append(
                f"scheduler.params.{key}: 'auto' but nothing filled it; set a number (the HF "
                "Trainer integration fills it from TrainingArguments)"
            )
    if problems:
        raise ConfigError(
            _headed(f"invalid ds config for world size {world_size}", problems)
            + _ignored_note(cfg._ignored)
        )
    return ResolvedConfig(
        raw=cfg,
        world_size=world_size,
        train_batch_size=train,
        train_micro_batch_size_per_gpu=micro,
        gradient_accumulation_steps=gas,
        gradient_clipping=float(clip),
        reduce_bucket_size=buckets["reduce_bucket_size"],
        allgather_bucket_size=buckets["allgather_bucket_size"],
    )


def _triad(cfg: DsConfig, world: int, problems: list[str]) -> tuple[int, int, int]:
    def given(v: Any) -> int | None:
        return v if isinstance(v, int) else None

    train = given(cfg.train_batch_size)
    micro = given(cfg.train_micro_batch_size_per_gpu)
    gas = given(cfg.gradient_accumulation_steps)
    if train is not None and micro is not None and gas is not None:
        if train != micro * gas * world:
            problems.append(
                f"batch sizes are inconsistent: train_batch_size={train} must equal "
                f"train_micro_batch_size_per_gpu ({micro}) x gradient_accumulation_steps ({gas}) "
                f"x world size ({world}) = {micro * gas * world}"
            )
        return train, micro, gas
    if train is not None and micro is not None:
        if train % (micro * world):
            problems.append(
                f"train_batch_size={train} is not divisible by train_micro_batch_size_per_gpu "
                f"({micro}) x world size ({world}) = {micro * world}; gradient_accumulation_steps "
                "would not be an integer"
            )
            return train, micro, 1
        return train, micro, train // (micro * world)
    if train is not None and gas is not None:
        if train % (gas * world):
            problems.append(
                f"train_batch_size={train} is not divisible by gradient_accumulation_steps ({gas}) "
                f"x world size ({world}) = {gas * world}; the micro-batch would not be an integer"
            )
            return train, 1, gas
        return train, train // (gas * world), gas
    if micro is not None:
        gas = gas or 1
        return micro * gas * world, micro, gas
    if train is not None:
        if train % world:
            problems.append(
                f"train_batch_size={train} is not divisible by the world size ({world}); set "
                "train_micro_batch_size_per_gpu"
            )
            return train, 1, 1
        return train, train // world, 1
    problems.append(
        "batch size: set train_batch_size or train_micro_batch_size_per_gpu (either, with "
        "gradient_accumulation_steps optional, determines the other)"
    )
    return 1, 1, 1
