"""Load a model family from a local Hugging Face directory or an in-memory ``transformers`` model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ds.interfaces import registry
from ds.interfaces.errors import ConfigError, ProviderNotFoundError


def read_config(path: str | Path) -> dict[str, Any]:
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"{path} has no config.json; pass a Hugging Face model directory")
    config: dict[str, Any] = json.loads(cfg_file.read_text())
    return config


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Weights from ``model.safetensors`` or the shards named by ``model.safetensors.index.json``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    root = Path(path)
    index = root / "model.safetensors.index.json"
    single = root / "model.safetensors"
    if index.is_file():
        files = [
            root / s for s in sorted(set(json.loads(index.read_text())["weight_map"].values()))
        ]
    elif single.is_file():
        files = [single]
    else:
        raise ConfigError(
            f"{root} has neither model.safetensors nor model.safetensors.index.json; "
            "save the model with save_pretrained(..., safe_serialization=True)"
        )
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            weights.update(load_file(str(file)))
        except (SafetensorError, OSError) as exc:
            raise ConfigError(f"cannot read weights from {file}: {exc}") from exc
    return weights


def from_module(model: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """config and weights of an in-memory ``transformers`` PreTrainedModel (no copy made)."""
    config = model.config.to_dict()
    weights = {k: v.detach() for k, v in model.state_dict().items()}
    return config, weights


def family_for(config: dict[str, Any]) -> Any:
    model_type = config.get("model_type")
    if not model_type:
        raise ConfigError("model config has no model_type; cannot pick a model family")
    try:
        return registry.get(registry.INFERENCE_MODELS, str(model_type))
    except ProviderNotFoundError as exc:
        raise ConfigError(
            f"no inference model family registered for model_type {model_type!r}: {exc}"
        ) from exc
