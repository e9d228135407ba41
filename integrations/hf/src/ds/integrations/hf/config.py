"""Filling a DeepSpeed-style config's ``"auto"`` values from ``TrainingArguments``, as strictly as
transformers does it for DeepSpeed (``HfTrainerDeepSpeedConfig``).

Two phases, as in transformers:

- ``fill_auto`` (when the Trainer is built): batch sizes, accumulation, clipping, optimizer
  ``lr``/``betas``/``eps``/``weight_decay``, scheduler ``warmup_min_lr``/``warmup_max_lr``,
  ``fp16.enabled`` and ``bf16.enabled``. An "auto" value is replaced by the argument; a number that
  disagrees with the argument is a mismatch (``bf16.enabled: true`` with ``bf16=False`` arguments
  is one), and every mismatch is reported in one ``ConfigError``.
- ``finalize_auto`` (once the model and the number of training steps are known): bucket sizes from
  the model's hidden size, scheduler ``total_num_steps`` and ``warmup_num_steps``.

A config ``scheduler`` section is kept: the engine builds that schedule and steps it, as
DeepSpeed's engine does under transformers; without one, the Trainer's own schedule drives the
engine optimizer's learning rate.
"""

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
_HIDDEN_SIZE_KEYS = (
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)


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


class _Filler:
    """transformers' fill_match / fill_only over one config dict, collecting mismatches."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.mismatches: list[str] = []

    def node(self, key: str) -> tuple[dict[str, Any] | None, str]:
        *parents, leaf = key.split(".")
        node: Any = self.config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return None, leaf
        return (node if isinstance(node, dict) else None), leaf

    def is_auto(self, key: str) -> bool:
        node, leaf = self.node(key)
        return node is not None and node.get(leaf) == AUTO

    def fill(self, key: str, value: Any, arg: str = "", must_match: bool = True) -> None:
        node, leaf = self.node(key)
        if node is None:
            return
        current = node.get(leaf)
        if current == AUTO:
            node[leaf] = value
        elif must_match and current is not None and current != value:
            self.mismatches.append(f"{key}={current!r} but TrainingArguments give {arg}={value!r}")

    def raise_mismatches(self) -> None:
        if self.mismatches:
            count = len(self.mismatches)
            raise ConfigError(
                f"ds_config disagrees with TrainingArguments in {count} place"
                f"{'s' if count != 1 else ''} (transformers with DeepSpeed refuses these too):\n"
                "  - " + "\n  - ".join(self.mismatches) + '\nset these config values to "auto" '
                "to take them from the arguments, or make the two agree"
            )


def fill_auto(source: Any, args: Any, world_size: int) -> dict[str, Any]:
    """The config with every "auto" value ``args`` determines filled in; a config number that
    disagrees with ``args`` is an error listing every such key. Batch sizes and accumulation
    missing from the config are taken from ``args`` (as accelerate does for DeepSpeed)."""
    cfg = load(source)
    f = _Filler(cfg)
    micro = int(args.per_device_train_batch_size)
    gas = int(args.gradient_accumulation_steps)
    exact = not bool(getattr(args, "auto_find_batch_size", False))
    # Absent batch keys are taken from the arguments (accelerate fills them for DeepSpeed).
    for key in (
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "train_batch_size",
    ):
        cfg.setdefault(key, AUTO)
    f.fill("train_micro_batch_size_per_gpu", micro, "per_device_train_batch_size", exact)
    f.fill("gradient_accumulation_steps", gas, "gradient_accumulation_steps")
    f.fill(
        "train_batch_size",
        micro * gas * world_size,
        f"per_device_train_batch_size x gradient_accumulation_steps x world size ({world_size})",
        exact,
    )
    f.fill("gradient_clipping", args.max_grad_norm, "max_grad_norm")
    f.fill("optimizer.params.lr", args.learning_rate, "learning_rate")
    f.fill("optimizer.params.betas", [args.adam_beta1, args.adam_beta2], "adam_beta1+adam_beta2")
    f.fill("optimizer.params.eps", args.adam_epsilon, "adam_epsilon")
    f.fill("optimizer.params.weight_decay", args.weight_decay, "weight_decay")
    f.fill("scheduler.params.warmup_min_lr", 0, must_match=False)  # not a Trainer argument
    f.fill("scheduler.params.warmup_max_lr", args.learning_rate, "learning_rate")
    if getattr(args, "save_on_each_node", False):
        cfg.setdefault("checkpoint", {})["use_node_local_storage"] = True
    fp16 = bool(args.fp16 or getattr(args, "fp16_full_eval", False))
    bf16 = bool(args.bf16 or getattr(args, "bf16_full_eval", False))
    f.fill("fp16.enabled", fp16, "fp16|fp16_full_eval")
    f.fill("bf16.enabled", bf16, "bf16|bf16_full_eval")
    # Mixed precision asked for by the arguments and absent from the config (accelerate adds it).
    if fp16 and "fp16" not in cfg:
        cfg["fp16"] = {"enabled": True}
    if bf16 and "bf16" not in cfg:
        cfg["bf16"] = {"enabled": True}
    f.raise_mismatches()
    return cfg


def hidden_size_of(model: Any) -> int | None:
    """The hidden size transformers reads from a model's config for the bucket-size "auto"s."""
    config = getattr(model, "config", None)
    for node in (config, getattr(config, "text_config", None)):
        if node is None:
            continue
        if getattr(node, "hidden_size", None) is not None:
            return int(node.hidden_size)
        if getattr(node, "hidden_sizes", None):
            return int(max(node.hidden_sizes))
    return None


def finalize_auto(
    cfg: dict[str, Any], args: Any, model: Any, num_training_steps: int
) -> dict[str, Any]:
    """The second phase: "auto" values that need the model or the step count (in place, and
    returned). Mismatching scheduler step counts are errors, as in transformers."""
    f = _Filler(cfg)
    autos = [k for k in _HIDDEN_SIZE_KEYS if f.is_auto(k)]
    if autos:
        hidden = hidden_size_of(model)
        if hidden is None:
            raise ConfigError(
                "the model's config has no hidden_size (or hidden_sizes), so these 'auto' values "
                f"cannot be filled: {', '.join(autos)}; set them to numbers"
            )
        f.fill("zero_optimization.reduce_bucket_size", hidden * hidden, must_match=False)
        if (cfg.get("zero_optimization") or {}).get("stage") == 3:
            f.fill(
                "zero_optimization.stage3_prefetch_bucket_size",
                int(0.9 * hidden * hidden),
                must_match=False,
            )
            f.fill(
                "zero_optimization.stage3_param_persistence_threshold",
                10 * hidden,
                must_match=False,
            )
    f.fill("scheduler.params.total_num_steps", num_training_steps, "num_training_steps")
    # DeepSpeed 0.19.8 refuses warmup_num_steps <= 0; transformers keeps the filled value >= 1.
    warmup = max(1, int(args.get_warmup_steps(num_training_steps)))
    f.fill("scheduler.params.warmup_num_steps", warmup, "warmup_steps")
    f.raise_mismatches()
    leftover = _autos(cfg)
    if leftover:
        log.debug("auto values left for the engine", keys=leftover)
    return cfg


def _autos(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        out: list[str] = []
        for k, v in node.items():
            out.extend(_autos(v, f"{prefix}{k}."))
        return out
    return [prefix.rstrip(".")] if node == AUTO else []
