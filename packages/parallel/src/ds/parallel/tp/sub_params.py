"""Fused parameters split per sub-parameter: a weight packing several logical parameters (q, k, v;
gate and up) along one dimension is cut so that every rank holds its piece of each, concatenated.

A layer spec's ``shape`` views the weight before the cut: ``(3, -1)`` three equal sub-parameters
at ``partition_dim`` 0, ``((q, k, v), -1)`` unequal ones, ``-1`` one dimension inferred. Each
sub-parameter is split over the ranks at widths fixed when the layer is built (one list per
sub-parameter, one width per rank), so cutting, gathering and the universal-checkpoint record
all use the same widths. A rank may hold a width of 0 (fewer heads than ranks).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch


def _label(name: str | None) -> str:
    return f"AutoTP layer '{name}'" if name else "AutoTP layer"


def _spec_dim(d: Any, what: str) -> int | None:
    if not isinstance(d, int):
        raise ValueError(f"{what} shape dimensions must be integers")
    if d == -1:
        return None
    if d <= 0:
        raise ValueError(f"{what} shape dimensions must be positive integers or -1")
    return d


def resolve_sub_param_shape(
    weight_shape: Sequence[int], shape: Sequence[Any], partition_dim: int, name: str | None = None
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...] | None, int | None]:
    """``(logical_shape, output_shape, sub_param_sizes, bias_partition_dim)`` of a weight of
    ``weight_shape`` viewed as ``shape`` (its last dimension is the input features; the others
    are the output features, which a bias shares). ``sub_param_sizes`` is None for a plain split,
    ``bias_partition_dim`` None when the cut is on the input features (the bias is whole)."""
    what = _label(name)
    if not isinstance(shape, (tuple, list)):
        raise ValueError(f"{what}: the sub-parameter shape must be a tuple")
    if not 0 <= partition_dim < len(shape):
        raise ValueError(f"{what}: partition_dim {partition_dim} is out of range for {shape}")
    sizes: tuple[int, ...] | None = None
    count = None
    dims: list[int | None] = []
    for i, d in enumerate(shape):
        if i == partition_dim and isinstance(d, (tuple, list)):
            if not d or not all(isinstance(v, int) and v > 0 for v in d):
                raise ValueError(f"{what}: sub-parameter sizes must be positive integers")
            sizes = tuple(int(v) for v in d)
            dims.append(sum(sizes))
        elif i == partition_dim:
            count = _spec_dim(d, what)
            dims.append(None)
        else:
            dims.append(_spec_dim(d, what))
    numel = math.prod(weight_shape)
    holes = [i for i, d in enumerate(dims) if d is None]
    known = math.prod(d for d in dims if d is not None)
    if len(holes) == 1 and known and numel % known == 0:
        dims[holes[0]] = numel // known
    elif len(holes) > 1 and len(shape) == len(weight_shape):
        for i in holes:
            dims[i] = int(weight_shape[i])
    logical = tuple(int(d) for d in dims if d is not None)
    if len(logical) != len(dims) or math.prod(logical) != numel:
        raise ValueError(f"{what}: shape {tuple(shape)} does not view a weight of {weight_shape}")
    if logical[-1] != weight_shape[-1]:
        raise ValueError(
            f"{what}: the last dimension of {tuple(shape)} must be the input features "
            f"{weight_shape[-1]}"
        )
    output = logical[:-1]
    if not output or math.prod(output) != weight_shape[0]:
        raise ValueError(f"{what}: shape {tuple(shape)} leaves no output features")
    if count is not None:
        if logical[partition_dim] % count:
            raise ValueError(
                f"{what}: dimension {logical[partition_dim]} does not split into {count} "
                "sub-parameters"
            )
        sizes = (logical[partition_dim] // count,) * count
    bias_dim = partition_dim if partition_dim < len(output) else None
    return logical, output, sizes, bias_dim


def even_split(total: int, tp: int) -> list[int]:
    """``total`` over ``tp`` ranks, the lowest ranks one more when it does not divide."""
    return [total // tp + (1 if r < total % tp else 0) for r in range(tp)]


def shard_widths(
    sizes: Sequence[int], tp: int, split: Callable[[int], Sequence[int]] | None = None
) -> list[list[int]]:
    """Every sub-parameter's per-rank widths; ``split`` gives the widths of one dimension
    (default :func:`even_split`), and must tile it."""
    out = []
    for size in sizes:
        widths = list(split(size) if split is not None else even_split(size, tp))
        check_widths([size], [widths], tp)
        out.append(widths)
    return out


def check_widths(sizes: Sequence[int], widths: Sequence[Sequence[int]], tp: int) -> None:
    if len(widths) != len(sizes):
        raise AssertionError(f"{len(widths)} shard width lists for {len(sizes)} sub-parameters")
    for size, w in zip(sizes, widths):
        if len(w) != tp or sum(w) != size or min(w) < 0:
            raise AssertionError(
                f"shard widths {list(w)} do not split a sub-parameter of {size} over {tp} ranks"
            )


def cut(
    tensor: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    widths: Sequence[Sequence[int]],
    rank: int,
) -> torch.Tensor:
    """Rank ``rank``'s piece of every sub-parameter of ``tensor`` along ``dim``, concatenated."""
    check_widths(sizes, widths, len(widths[0]) if widths else 0)
    pieces = [
        sub.narrow(dim, sum(w[:rank]), w[rank])
        for sub, w in zip(tensor.split(list(sizes), dim=dim), widths)
    ]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=dim)


def join(pieces: Sequence[torch.Tensor], dim: int, widths: Sequence[Sequence[int]]) -> torch.Tensor:
    """The whole tensor from every rank's piece (rank order): the inverse of :func:`cut`."""
    per_rank = [p.split([w[r] for w in widths], dim=dim) for r, p in enumerate(pieces)]
    subs = [
        torch.cat([per_rank[r][i] for r in range(len(pieces))], dim=dim) for i in range(len(widths))
    ]
    return subs[0] if len(subs) == 1 else torch.cat(subs, dim=dim)


def gather(local: torch.Tensor, dim: int, widths: Sequence[Sequence[int]], tp: Any) -> torch.Tensor:
    """The whole tensor from this rank's piece ``local`` and the other ranks' (a collective over
    the TP group ``tp``). Pieces differ in width, so each is padded to the widest for the
    all-gather and trimmed after."""
    if tp.size == 1:
        return local
    held = [sum(w[r] for w in widths) for r in range(tp.size)]
    if local.shape[dim] != held[tp.rank]:
        raise AssertionError(
            f"rank {tp.rank} holds {local.shape[dim]} along dim {dim}, its widths say {held[tp.rank]}"
        )
    padded_shape = list(local.shape)
    padded_shape[dim] = max(held)
    padded = local.new_zeros(padded_shape)
    padded.narrow(dim, 0, local.shape[dim]).copy_(local)
    parts = [torch.empty_like(padded) for _ in range(tp.size)]
    tp.comm.all_gather(parts, padded, group=tp.group)
    return join([p.narrow(dim, 0, n) for p, n in zip(parts, held)], dim, widths)


__all__ = [
    "check_widths",
    "cut",
    "even_split",
    "gather",
    "join",
    "resolve_sub_param_shape",
    "shard_widths",
]
