"""ZeRO-3 ``from_pretrained``: build the model partitioned under ``ds.zero.Init`` and fill each
rank's slices straight from the safetensors files, one tensor at a time, so that no rank ever
holds the whole model."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ds.integrations.hf._registry import provided
from ds.interfaces.errors import ConfigError


class SafetensorsFiles(Mapping[str, torch.Tensor]):
    """A read-only mapping over a checkpoint directory's safetensors files; a tensor is read only
    when it is looked up."""

    def __init__(self, directory: str) -> None:
        from safetensors import safe_open

        index = os.path.join(directory, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        missing = [f for f in files if not os.path.exists(os.path.join(directory, f))]
        if missing:
            raise ConfigError(
                f"{directory} has no {', '.join(missing)}: from_pretrained_zero3 reads "
                "safetensors checkpoints (save with save_pretrained(safe_serialization=True))"
            )
        self._handles = [safe_open(os.path.join(directory, f), framework="pt") for f in files]
        self._where: dict[str, Any] = {}
        for h in self._handles:
            for key in h.keys():  # type: ignore[no-untyped-call]  # noqa: SIM118
                self._where[key] = h

    def __getitem__(self, key: str) -> torch.Tensor:
        t: torch.Tensor = self._where[key].get_tensor(key)
        return t

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, key: object) -> bool:
        return key in self._where


def from_pretrained_zero3(
    model_cls: Any,
    path: str,
    *,
    dtype: torch.dtype | None = None,
    config: Any = None,
    **init_kwargs: Any,
) -> Any:
    """``model_cls.from_pretrained(path)`` for ZeRO-3: parameters are partitioned across the
    data-parallel ranks as the model is built, then each rank copies its own slice of every
    tensor from the files. Every rank must call it. ``init_kwargs`` go to ``ds.zero.Init``."""
    if not os.path.isdir(path):
        raise ConfigError(f"from_pretrained_zero3 needs a local checkpoint directory, got {path!r}")
    if config is None:
        config = model_cls.config_class.from_pretrained(path)
    with provided("zero_init")(dtype=dtype, **init_kwargs):
        model = model_cls(config)
    files = SafetensorsFiles(path)
    missing = provided("load_state_dict_into_shards")(model, files, strict=False)
    tied = _tied_names(model)
    untied = [m for m in missing if m not in tied]
    if untied:
        raise ConfigError(f"{path} lacks weights for: {', '.join(untied)}")
    model.eval()
    return model


def _tied_names(model: Any) -> set[str]:
    """Parameters shared with another name (tied embeddings) are loaded through that name."""
    seen: dict[int, str] = {}
    tied: set[str] = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.add(name)
        seen.setdefault(id(p), name)
    return tied
