"""Reading a pipeline checkpoint (``layer_XX-model_states.pt`` per layer, as ds's PipelineEngine
and DeepSpeed's write them) as one model's tensors, for ``ds checkpoint export``.

Names are the ones a one-stage ``PipelineModule`` of the same layers gives its state dict: layer
``XX``'s tensors as ``"XX.<name>"``, a tied module's (saved once, under its first layer) as
``"tied_modules.<key>.<name>"`` where the checkpoint's ``pipeline_states.pt`` records the key.
A pipeline x tensor-parallel checkpoint holds one file per layer and TP rank
(``layer_XX-model_YY-model_states.pt``); each sliced tensor is joined from its TP files along the
split dim ``pipeline_states.pt`` records (``tp_layout``).
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

import torch

from ds.interfaces.errors import CheckpointError
from ds.interfaces.parallel import join_slices

_LAYER = re.compile(r"^layer_(\d+)(?:-model_(\d+))?-model_states\.pt$")


def pipeline_root(directory: str, tag: str | None) -> str | None:
    """The folder holding the layer files, if ``directory`` (at ``tag``, else at its ``latest``)
    is a pipeline checkpoint."""
    from ds.checkpoint._format import check_tag, read_latest

    tag = read_latest(directory) if tag is None else check_tag(tag)
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


# Entries are written in layer order: keeping the last opened files (a layer's TP files are read
# in turn for each tensor) parses each one once. Memory-mapped, they hold no tensor data.
_open_layer = functools.lru_cache(maxsize=8)(_load)


def pipeline_entries(root: str, exclude_frozen: bool) -> list[Any]:
    """One entry per tensor of every layer file under ``root``, in layer order, as fp32."""
    if exclude_frozen:
        raise CheckpointError(
            f"{root}: --exclude_frozen_parameters is not supported for pipeline checkpoints "
            "(their layer files do not say which parameters were frozen); export without it"
        )
    tied: dict[int, str] = {}
    layout: dict[str, Any] = {}
    states = os.path.join(root, "pipeline_states.pt")
    if os.path.isfile(states):
        saved = _load(states)
        tied = {int(i): str(k) for i, k in (saved.get("tied_layers") or {}).items()}
        layout = dict(saved.get("tp_layout") or {})
    files: dict[int, dict[int, str]] = {}  # layer -> TP rank -> file name
    for n in os.listdir(root):
        if m := _LAYER.match(n):
            files.setdefault(int(m.group(1)), {})[int(m.group(2) or 0)] = n
    out = []
    for idx in sorted(files):
        ranks = files[idx]
        if sorted(ranks) != list(range(len(ranks))):
            raise CheckpointError(
                f"{root}: layer {idx} has TP files {sorted(ranks)}; every TP rank's file is needed"
            )
        if len(ranks) > 1 and not layout:
            raise CheckpointError(
                f"{root}: layer {idx} is saved in {len(ranks)} tensor-parallel files but "
                "pipeline_states.pt records no tp_layout (which dim each tensor is split on); "
                "export a checkpoint ds saved"
            )
        paths = [os.path.join(root, ranks[i]) for i in range(len(ranks))]
        prefix = f"tied_modules.{tied[idx]}" if idx in tied else str(idx)
        out.extend(_layer_entries(paths, prefix, layout))
    return out


def _layer_entries(paths: list[str], prefix: str, layout: dict[str, Any]) -> list[Any]:
    """One entry per tensor of a layer saved by ``len(paths)`` TP ranks (slices joined)."""
    from ds.checkpoint.deepspeed_export import Entry

    first = _load(paths[0])
    if not isinstance(first, dict):
        raise CheckpointError(f"{paths[0]}: a layer file holds a state dict, found {type(first)}")
    out = []
    for key, t in first.items():
        if not isinstance(t, torch.Tensor):
            continue
        name = f"{prefix}.{key}"
        split = layout.get(name) if len(paths) > 1 else None
        shape = list(t.shape)
        if split is not None:
            shape[int(split[0])] *= len(paths)
        dtype = torch.float32 if t.is_floating_point() else t.dtype

        def read(key: str = key, dtype: torch.dtype = dtype, split: Any = split) -> torch.Tensor:
            if split is None:  # replicated over TP: rank 0's copy
                return _open_layer(paths[0])[key].to(dtype)
            pieces = [_open_layer(p)[key].to(dtype) for p in paths]
            return join_slices(pieces, int(split[0]), int(split[1]))

        out.append(Entry(name, tuple(shape), dtype, read))
    return out


__all__ = ["pipeline_entries", "pipeline_root"]
