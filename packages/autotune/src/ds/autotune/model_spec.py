"""What model ``ds estimate`` plans for: a transformers ``config.json`` (a file or a directory
holding one), or a callable that builds the module on a given device."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ds.interfaces.errors import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[[torch.device], torch.nn.Module]  # makes the module on a device
    params: int
    largest_layer_params: int
    vocab_size: int | None = None


def _count(build: Callable[[torch.device], torch.nn.Module]) -> tuple[int, int]:
    model = build(torch.device("meta"))
    params = sum(p.numel() for p in model.parameters())
    largest = max(
        (sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0
    )
    return params, largest


def from_module_builder(name: str, build: Callable[[torch.device], torch.nn.Module]) -> ModelSpec:
    params, largest = _count(build)
    return ModelSpec(name, build, params, largest)


def from_hf_config(path: str | Path, dtype: torch.dtype = torch.bfloat16) -> ModelSpec:
    """A causal LM from a transformers config file or directory (no weights are read)."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    try:
        raw = json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"--model {path}: no such file (give a config.json or its directory)"
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"--model {path}: cannot read it as a JSON model config ({exc})"
        ) from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ConfigError(f"--model {path}: not a transformers config (no 'model_type' key)")
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise ConfigError(
            "--model with a config.json needs transformers: pip install 'ds-autotune[hf]'"
        ) from None
    try:
        cfg = AutoConfig.for_model(**raw)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--model {path}: transformers cannot read this config ({exc})") from None

    def build(device: torch.device) -> torch.nn.Module:
        with torch.device(device):
            return AutoModelForCausalLM.from_config(cfg, dtype=dtype)

    params, largest = _count(build)
    return ModelSpec(
        file.parent.name or str(file), build, params, largest, getattr(cfg, "vocab_size", None)
    )


def describe(spec: ModelSpec) -> dict[str, Any]:
    return {
        "model": spec.name,
        "params": spec.params,
        "largest_layer_params": spec.largest_layer_params,
    }
