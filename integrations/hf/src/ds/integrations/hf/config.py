"""Filling a DeepSpeed-style config's ``"auto"`` values from ``TrainingArguments``."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from typing import Any

from ds.interfaces.errors import ConfigError
from ds.interfaces.logging import get_logger

log = get_logger(__name__)

AUTO = "auto"


def load(source: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """A config from a JSON file path, a JSON string or a dict (copied, never mutated)."""
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    text = str(source)
    if os.path.exists(text):
        with open(text) as f:
            data = json.load(f)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"ds_config={text!r} is neither an existing file nor a JSON object; pass a path "
                "to a DeepSpeed-style JSON config or a dict"
            ) from e
    if not isinstance(data, dict):
        raise ConfigError(f"ds_config must hold a JSON object, got {type(data).__name__}")
    return data


def _fill(section: dict[str, Any], key: str, value: Any, explicit: bool = False) -> None:
    """Set ``key`` when it is "auto" (or absent, for values the Trainer always owns)."""
    current = section.get(key, AUTO if explicit else None)
    if current == AUTO:
        section[key] = value


def fill_auto(source: Any, args: Any, world_size: int) -> dict[str, Any]:
    """The config with every "auto" value the Trainer knows replaced, and batch sizes and
    accumulation always taken from ``args`` (a number that disagrees is an error naming both)."""
    cfg = load(source)
    micro = int(args.per_device_train_batch_size)
    gas = int(args.gradient_accumulation_steps)
    _agree(cfg, "train_micro_batch_size_per_gpu", micro, "per_device_train_batch_size")
    _agree(cfg, "gradient_accumulation_steps", gas, "gradient_accumulation_steps")
    _agree(cfg, "train_batch_size", micro * gas * world_size, "the product of both x world size")
    _fill(cfg, "gradient_clipping", float(args.max_grad_norm or 0.0), explicit=True)

    opt = cfg.get("optimizer")
    if isinstance(opt, dict):
        params = opt.setdefault("params", {})
        _fill(params, "lr", float(args.learning_rate))
        _fill(params, "betas", [float(args.adam_beta1), float(args.adam_beta2)])
        _fill(params, "eps", float(args.adam_epsilon))
        _fill(params, "weight_decay", float(args.weight_decay))

    for name, flag in (("bf16", bool(args.bf16)), ("fp16", bool(args.fp16))):
        section = cfg.get(name)
        if isinstance(section, dict):
            _fill(section, "enabled", flag)
        elif flag:
            cfg[name] = {"enabled": True}

    sched = cfg.get("scheduler")
    if isinstance(sched, dict):
        params = sched.get("params", {})
        if params and any(v != AUTO for v in params.values()):
            raise ConfigError(
                "ds_config has a 'scheduler' section with fixed values; with the Trainer the "
                "learning-rate schedule comes from TrainingArguments (lr_scheduler_type, "
                "warmup_steps): remove the section or leave its params 'auto'"
            )
        # All-"auto" schedulers describe what the Trainer's own scheduler already does.
        del cfg["scheduler"]
    leftover = _autos(cfg)
    if leftover:
        log.debug("auto values left for the engine", keys=leftover)
    return cfg


def _agree(cfg: dict[str, Any], key: str, value: int, arg: str) -> None:
    current = cfg.get(key, AUTO)
    if current == AUTO:
        cfg[key] = value
    elif int(current) != value:
        raise ConfigError(
            f"ds_config {key}={current} but TrainingArguments give {value} ({arg}); set the "
            f'config value to "auto" or make them agree'
        )


def _autos(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        out: list[str] = []
        for k, v in node.items():
            out.extend(_autos(v, f"{prefix}{k}."))
        return out
    return [prefix.rstrip(".")] if node == AUTO else []
