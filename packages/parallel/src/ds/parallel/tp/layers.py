"""Tensor-parallel replacements for nn.Linear, transformers' Conv1D and nn.Embedding.

Each holds only its slice of the original weight under the original parameter names, so the
model's state-dict keys do not change; sliced parameters carry ``TP_DIM_ATTR`` (and
``TP_FUSED_ATTR`` when the split dimension packs several segments, as GPT-2's fused q,k,v does).

* Column-parallel: the input is copied to every rank (identity forward, all-reduce of its grad
  backward), the local matmul gives this rank's slice of the output features; with
  ``gather_output`` the slices are all-gathered along the last dim (the LM head).
* Row-parallel: the input arrives sharded on its last dim, the local matmul gives a partial sum,
  all-reduced forward (identity backward); the bias, replicated, is added once after the reduce.
* Vocab-parallel embedding: each rank owns a contiguous range of the vocabulary, looks up the ids
  in it (others give zeros) and the rows are all-reduced.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ds.interfaces.parallel import TP_DIM_ATTR, TP_FUSED_ATTR, split_slice

from ._collectives import TPGroup, copy_to_tp, gather_from_tp, reduce_from_tp
from .uc_layout import full_shape


def shard(t: torch.Tensor, dim: int, tp: TPGroup, fused: int = 1) -> torch.Tensor:
    """This rank's slice of ``t`` along ``dim``; with ``fused`` segments, each is split apart."""
    return split_slice(t, dim, tp.size, tp.rank, fused)  # type: ignore[no-any-return]


def sliced_parameter(
    p: nn.Parameter, dim: int, tp: TPGroup, fused: int = 1, cache: dict[int, Any] | None = None
) -> nn.Parameter:
    """A new Parameter holding this rank's slice of ``p``, marked with its split dim. ``cache``
    returns the same new Parameter for a tied (shared) original."""
    key = id(p)
    if cache is not None and key in cache:
        return cache[key]
    new = nn.Parameter(shard(p.detach(), dim, tp, fused).clone(), requires_grad=p.requires_grad)
    setattr(new, TP_DIM_ATTR, dim)
    if fused > 1:
        setattr(new, TP_FUSED_ATTR, fused)
    if cache is not None:
        cache[key] = new
    return new


def replicated(p: nn.Parameter | None, cache: dict[int, Any] | None) -> nn.Parameter | None:
    if p is None or cache is None:
        return p
    return cache.setdefault(id(p), p)


class _SlicedLinear(nn.Module):
    """A linear layer holding this rank's slice of the weight. ``transposed``: Conv1D layout
    ``[in, out]``."""

    def __init__(
        self, weight: nn.Parameter, bias: nn.Parameter | None, tp: TPGroup, transposed: bool
    ) -> None:
        super().__init__()
        self.tp = tp
        self.transposed = transposed
        self.weight = weight
        self.bias = bias


class ColumnParallelLinear(_SlicedLinear):
    """Output features split over the TP group."""

    def __init__(
        self,
        weight: nn.Parameter,
        bias: nn.Parameter | None,
        tp: TPGroup,
        *,
        transposed: bool = False,
        gather_output: bool = False,
        fused: int = 1,
    ) -> None:
        super().__init__(weight, bias, tp, transposed)
        self.gather_output = gather_output
        self.fused = fused
        out_dim = 1 if transposed else 0
        shape = full_shape(weight)
        self.in_features = shape[0 if transposed else 1]
        self.out_features = shape[out_dim] * tp.size  # the full width
        self.local_out_features = shape[out_dim]

    @classmethod
    def from_module(
        cls,
        module: nn.Module,
        tp: TPGroup,
        *,
        transposed: bool = False,
        gather_output: bool = False,
        fused: int = 1,
        cache: dict[int, Any] | None = None,
    ) -> ColumnParallelLinear:
        out_dim = 1 if transposed else 0
        weight = sliced_parameter(module.weight, out_dim, tp, fused, cache)
        bias = getattr(module, "bias", None)
        if bias is not None:
            bias = sliced_parameter(bias, 0, tp, fused, cache)
        return cls(
            weight, bias, tp, transposed=transposed, gather_output=gather_output, fused=fused
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_tp(x, self.tp)
        if self.transposed:
            y = torch.matmul(x, self.weight)
            if self.bias is not None:
                y = y + self.bias
        else:
            y = F.linear(x, self.weight, self.bias)
        return gather_from_tp(y, self.tp) if self.gather_output else y

    def extra_repr(self) -> str:
        return (
            f"in={self.in_features}, out={self.local_out_features}/{self.out_features}, "
            f"tp={self.tp.size}, gather_output={self.gather_output}, fused={self.fused}, "
            f"transposed={self.transposed}"
        )


class RowParallelLinear(_SlicedLinear):
    """Input features split over the TP group; partial outputs all-reduced, bias added once."""

    def __init__(
        self, weight: nn.Parameter, bias: nn.Parameter | None, tp: TPGroup, *, transposed: bool
    ) -> None:
        super().__init__(weight, bias, tp, transposed)
        in_dim = 0 if transposed else 1
        shape = full_shape(weight)
        self.in_features = shape[in_dim] * tp.size
        self.local_in_features = shape[in_dim]
        self.out_features = shape[1 if transposed else 0]

    @classmethod
    def from_module(
        cls,
        module: nn.Module,
        tp: TPGroup,
        *,
        transposed: bool = False,
        cache: dict[int, Any] | None = None,
    ) -> RowParallelLinear:
        weight = sliced_parameter(module.weight, 0 if transposed else 1, tp, 1, cache)
        bias = replicated(getattr(module, "bias", None), cache)
        return cls(weight, bias, tp, transposed=transposed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.matmul(x, self.weight) if self.transposed else F.linear(x, self.weight)
        y = reduce_from_tp(y, self.tp)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (
            f"in={self.local_in_features}/{self.in_features}, out={self.out_features}, "
            f"tp={self.tp.size}, transposed={self.transposed}"
        )


class VocabParallelEmbedding(nn.Module):
    """Rows (the vocabulary) split over the TP group in contiguous ranges."""

    def __init__(self, weight: nn.Parameter, tp: TPGroup, padding_idx: int | None) -> None:
        super().__init__()
        self.tp = tp
        self.weight = weight
        self.local_num_embeddings = weight.shape[0]
        self.num_embeddings = weight.shape[0] * tp.size
        self.embedding_dim = weight.shape[1]
        self.vocab_start = tp.rank * self.local_num_embeddings
        self.vocab_end = self.vocab_start + self.local_num_embeddings
        self.padding_idx = padding_idx  # the global id, as nn.Embedding reports it
        local_pad = None
        if padding_idx is not None and self.vocab_start <= padding_idx < self.vocab_end:
            local_pad = padding_idx - self.vocab_start
        self._local_padding_idx = local_pad

    @classmethod
    def from_module(
        cls, module: nn.Embedding, tp: TPGroup, cache: dict[int, Any] | None = None
    ) -> VocabParallelEmbedding:
        pad = module.padding_idx
        if pad is not None and pad < 0:
            pad += module.num_embeddings
        return cls(sliced_parameter(module.weight, 0, tp, 1, cache), tp, pad)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        rows = F.embedding(local, self.weight, self._local_padding_idx)
        rows = rows.masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(rows, self.tp)

    def extra_repr(self) -> str:
        return (
            f"vocab=[{self.vocab_start}, {self.vocab_end}) of {self.num_embeddings}, "
            f"dim={self.embedding_dim}, tp={self.tp.size}"
        )


def allreduce_grads_of(module: nn.Module, tp: TPGroup) -> None:
    """Make a replicated module whose inputs differ per TP rank (per-head norms acting on this
    rank's heads) sum its parameters' gradients over the group: a hook on each parameter
    all-reduces the gradient autograd computes for it, before it is accumulated."""
    if tp.size == 1:
        return
    for p in module.parameters(recurse=False):
        if p.requires_grad and not getattr(p, "_ds_tp_grad_allreduce", False):
            p.register_hook(tp.all_reduce)
            p._ds_tp_grad_allreduce = True  # type: ignore[attr-defined]
