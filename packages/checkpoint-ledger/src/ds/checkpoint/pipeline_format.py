"""Reading a pipeline checkpoint (``layer_XX-model_states.pt`` per layer, as ds's PipelineEngine
and DeepSpeed's write them) as one model's tensors, for ``ds checkpoint export``.

Names are the ones a one-stage ``PipelineModule`` of the same layers gives its state dict: layer
``XX``'s tensors as ``"XX.<name>"``, a tied module's (saved once, under its first layer) as
``"tied_modules.<key>.<name>"`` where the checkpoint's ``pipeline_states.pt`` records the key.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

import torch

from ds.interfaces.errors import CheckpointError

_LAYER = re.compile(r"^layer_(\d+)-model_states\.pt$")


def pipeline_root(directory: str, tag: str | None) -> str | None:
    """The folder holding the layer files, if ``directory`` (at ``tag``, else at its ``latest``)
    is a pipeline checkpoint."""
    if tag is None:
        latest = os.path.join(directory, "latest")
        if os.path.isfile(latest):
            with open(latest, encoding="utf-8") as f:
                tag = f.read().strip()
    for root in ([os.path.join(directory, tag)] if tag else []) + [directory]:
        if os.path.isdir(root) and any(_LAYER.match(n) for n in os.listdir(root)):
            return root
    return None


def _load(path: str) -> Any:
    try:
        # mmap: a layer file is read as its tensors are written out, not all at once
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # a truncated or foreign file: name it
        raise CheckpointError(f"{path}: not a readable checkpoint file ({e})") from e


# Entries are written in layer order: keeping the last opened file parses each one once.
_open_layer = functools.lru_cache(maxsize=1)(_load)


def pipeline_entries(root: str, exclude_frozen: bool) -> list[Any]:
    """One entry per tensor of every layer file under ``root``, in layer order, as fp32."""
    from ds.checkpoint.deepspeed_export import Entry

    if exclude_frozen:
        raise CheckpointError(
            f"{root}: --exclude_frozen_parameters is not supported for pipeline checkpoints "
            "(their layer files do not say which parameters were frozen); export without it"
        )
    tied: dict[int, str] = {}
    states = os.path.join(root, "pipeline_states.pt")
    if os.path.isfile(states):
        tied = {int(i): str(k) for i, k in (_load(states).get("tied_layers") or {}).items()}
    layers = sorted((int(m.group(1)), n) for n in os.listdir(root) if (m := _LAYER.match(n)))
    out = []
    for idx, name in layers:
        path = os.path.join(root, name)
        state = _load(path)
        if not isinstance(state, dict):
            raise CheckpointError(f"{path}: a layer file holds a state dict, found {type(state)}")
        prefix = f"tied_modules.{tied[idx]}" if idx in tied else str(idx)
        for key, t in state.items():
            if not isinstance(t, torch.Tensor):
                continue
            dtype = torch.float32 if t.is_floating_point() else t.dtype

            def read(path: str = path, key: str = key, dtype: torch.dtype = dtype) -> torch.Tensor:
                return _open_layer(path)[key].to(dtype)

            out.append(Entry(f"{prefix}.{key}", tuple(t.shape), dtype, read))
    return out


__all__ = ["pipeline_entries", "pipeline_root"]
