"""Tensor parallelism inside pipeline stages: the whole tensors of a stage's TP slices, and the
layer files of a PP x TP checkpoint.

A stage's TP rank ``i`` of ``T`` writes its slices as DeepSpeed names model-parallel files,
``layer_XX-model_ii-model_states.pt`` (and ``-optim_states.pt``); with ``T = 1`` the names stay
``layer_XX-model_states.pt``. ``pipeline_states.pt`` records ``T`` and each sliced parameter's
split dim and fused segments, so a load at another TP size joins the saved slices of every
weight and optimizer moment and cuts this rank's.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ds.interfaces.errors import CheckpointError
from ds.interfaces.parallel import join_slices, split_slice, tp_dim, tp_fused

Layout = dict[str, tuple[int, int]]  # parameter name -> (split dim, fused segments)


def tp_size(engine: Any) -> int:
    return int(engine.mesh.shape.tp) if engine.mesh is not None else 1


def tp_index(engine: Any) -> int:
    return int(engine.mesh.index("tp")) if engine.mesh is not None and tp_size(engine) > 1 else 0


def layer_file(idx: int, kind: str, index: int, size: int) -> str:
    """``kind``: "model" or "optim"."""
    mp = f"-model_{index:02d}" if size > 1 else ""
    return f"layer_{idx:02d}{mp}-{kind}_states.pt"


def whole_tensors(engine: Any, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``sd`` (kept as parameters, with their TP marks) with every slice joined over the TP
    group. Collective over the stage's TP group: its ranks hold the same layers, in order."""
    if tp_size(engine) == 1:
        return {k: v.detach() for k, v in sd.items()}
    from ds.parallel.tp.autotp import tp_group_of
    from ds.parallel.tp.state import gather_tensor

    tp = tp_group_of(engine.mesh, engine.comm)
    out = {}
    for k, v in sd.items():
        dim = tp_dim(v)
        out[k] = v.detach() if dim is None else gather_tensor(v, tp, dim, tp_fused(v))
    return out


def layout_of(module: torch.nn.Module) -> Layout:
    return {
        name: (int(dim), tp_fused(p))
        for name, p in module.named_parameters()
        if (dim := tp_dim(p)) is not None
    }


def pipeline_layout(engine: Any) -> Layout:
    """Every stage's sliced parameters (names are global). Collective over the pp group."""
    mine = layout_of(engine.module)
    if engine.comm is None or engine.num_stages == 1 or tp_size(engine) == 1:
        return mine
    parts: list[Any] = [None] * engine.num_stages
    engine.comm.all_gather_object(parts, mine, group=engine.mesh.group("pp"))
    out: Layout = {}
    for part in parts:
        out.update(part)
    return out


def _load(path: str) -> Any:
    if not os.path.exists(path):
        raise CheckpointError(f"{path} is missing: the checkpoint lacks this layer file")
    return torch.load(path, weights_only=True)


class LayerFiles:
    """Reads a checkpoint's layer files as this rank's TP slice wants them."""

    def __init__(self, engine: Any, where: str, states: dict[str, Any]) -> None:
        self.where = where
        self.saved = int(states.get("tp_size", 1))
        self.saved_layout: Layout = {
            k: tuple(v) for k, v in (states.get("tp_layout") or {}).items()
        }
        self.size, self.index = tp_size(engine), tp_index(engine)
        self.params = dict(engine.module.named_parameters())
        self.layout = layout_of(engine.module)

    @property
    def same(self) -> bool:
        return self.saved == self.size

    def exists(self, idx: int, kind: str) -> bool:
        index = self.index if self.same else 0
        return os.path.exists(os.path.join(self.where, layer_file(idx, kind, index, self.saved)))

    def _pieces(self, idx: int, kind: str) -> list[Any]:
        return [
            _load(os.path.join(self.where, layer_file(idx, kind, i, self.saved)))
            for i in range(self.saved)
        ]

    def _whole_shape(self, name: str) -> tuple[int, ...]:
        shape = list(self.params[name].shape)
        if name in self.layout:
            dim, _ = self.layout[name]
            shape[dim] *= self.size
        return tuple(shape)

    def _reshard(self, name: str, pieces: list[torch.Tensor]) -> torch.Tensor:
        """This rank's slice of the tensor whose saved slices (in TP-rank order) are ``pieces``."""
        whole = pieces[0]
        if name in self.saved_layout:
            dim, fused = self.saved_layout[name]
            whole = join_slices(pieces, dim, fused)
        if name in self.layout:
            dim, fused = self.layout[name]
            whole = split_slice(whole, dim, self.size, self.index, fused)
        return whole.contiguous().clone()

    def model(self, idx: int, prefix: str) -> dict[str, torch.Tensor]:
        """Layer ``idx``'s state dict (keys inside the layer), ``prefix`` naming its module."""
        if self.same:
            return _load(os.path.join(self.where, layer_file(idx, "model", self.index, self.size)))
        pieces = self._pieces(idx, "model")
        return {k: self._reshard(f"{prefix}.{k}", [p[k] for p in pieces]) for k in pieces[0]}

    def optim(self, idx: int) -> dict[str, dict[str, Any]]:
        """Parameter name -> its optimizer state (moments flat, this rank's slice's numel)."""
        if self.same:
            return _load(os.path.join(self.where, layer_file(idx, "optim", self.index, self.size)))
        pieces = self._pieces(idx, "optim")
        out: dict[str, dict[str, Any]] = {}
        for name, first in pieces[0].items():
            if name not in self.params:
                continue
            whole = self._whole_shape(name)
            state: dict[str, Any] = {}
            for key, value in first.items():
                if not (isinstance(value, torch.Tensor) and value.dim()):
                    state[key] = value
                    continue
                shape = list(whole)
                if name in self.saved_layout:
                    shape[self.saved_layout[name][0]] //= self.saved
                parts = [p[name][key].reshape(shape) for p in pieces]
                state[key] = self._reshard(name, parts).reshape(-1)
            out[name] = state
        return out


__all__ = ["LayerFiles", "layer_file", "pipeline_layout", "tp_index", "tp_size", "whole_tensors"]
