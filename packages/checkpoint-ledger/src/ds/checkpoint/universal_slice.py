"""One tensor-parallel rank's slice of a whole parameter read from a universal checkpoint: the
inverse of :func:`ds.checkpoint.universal_tp.merge_tp_param`.

With an AutoTP record on the target parameter (``meta``: ``partition_dim``, ``logical_shape``,
``partition_sizes``, ``sub_param_sizes``, ``sub_param_shard_widths``, ``replicated``), the record
decides the cut, so uneven splits come back exactly as AutoTP makes them. Without one, the
checkpoint's own layout keys (``cat_dim``, ``sub_param_shape``, ``param_n_sub_params``) do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ds.checkpoint.universal_tp import (
    CAT_DIM,
    PARAM_N_SUB_PARAMS,
    SUB_PARAM_SHAPE,
    VERSION_KEY,
    WIDTHS_VERSION,
    SubparamShape,
    even_widths,
)


def load_entry(path: str) -> Any:
    """One ``zero/<param>/<state>.pt`` file, weights-only (its layout record, written by ds or
    by DeepSpeed, is the one class allowed)."""
    allowed = [
        SubparamShape,
        (SubparamShape, "deepspeed.checkpoint.universal_checkpoint.SubparamShape"),
    ]
    with torch.serialization.safe_globals(allowed):
        return torch.load(path, map_location="cpu", weights_only=True)


def narrow_sub_params(
    full: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    widths: Sequence[Sequence[int]] | None,
    tp_rank: int,
    tp: int,
    version: float,
) -> torch.Tensor:
    """This rank's piece of every sub-parameter along ``dim``, concatenated and flattened."""
    if sum(sizes) != full.shape[dim]:
        raise AssertionError(
            f"Sub-parameter sizes {list(sizes)} sum to {sum(sizes)}, but dimension {dim} of the "
            f"parameter is {full.shape[dim]}. The metadata describes a different parameter."
        )
    if version < WIDTHS_VERSION or widths is None:
        widths = even_widths(sizes, tp, "the parameter", version)
    if len(widths) != len(sizes):
        raise AssertionError(
            f"Got {len(widths)} shard width entries for {len(sizes)} sub-parameters."
        )
    pieces, offset = [], 0
    for size, w in zip(sizes, widths):
        if len(w) != tp or sum(w) != size:
            raise AssertionError(
                f"Sub-parameter shard widths {list(w)} do not split {size} over {tp} tp ranks."
            )
        pieces.append(full.narrow(dim, offset + sum(w[:tp_rank]), w[tp_rank]))
        offset += size
    return torch.cat(pieces, dim=dim).flatten()


def autotp_rank_slice(
    meta: Mapping[str, Any] | None, full: torch.Tensor, tp_rank: int, tp: int
) -> torch.Tensor | None:
    """The flat slice an AutoTP parameter described by ``meta`` holds on ``tp_rank``; None when
    ``meta`` does not describe a partition (the caller then uses the checkpoint's layout)."""
    if not meta:
        return None
    reason = (meta.get("conversion") or {}).get("unsupported_reason")
    if reason:
        raise RuntimeError(
            f"Cannot restore a universal checkpoint into this AutoTP parameter: {reason}"
        )
    if (meta.get("conversion") or {}).get("affine_map") is not None:
        raise NotImplementedError(
            "AutoTP parameters described by affine maps are not restored by ds"
        )
    dim = meta.get("partition_dim")
    if meta.get("replicated", False):
        if dim is not None:
            raise AssertionError("a replicated parameter has no partition_dim")
        return full.flatten()
    logical = meta.get("logical_shape")
    if dim is None or logical is None:
        return None
    view = full.view(tuple(logical))
    version = float(meta.get(VERSION_KEY, 0.0))
    sizes = meta.get("sub_param_sizes")
    spec = meta.get("sub_param_shape")
    if sizes is None and spec is not None:
        # a view spec such as (3, -1) carries the sub-parameter count at partition_dim, not a
        # width, so it is read only when the resolved sizes were not recorded
        if hasattr(spec, "shape") and hasattr(spec, "partition_dim"):
            dim, spec = spec.partition_dim, spec.shape
        sizes = spec[dim]
    if sizes is not None:
        sizes = tuple(sizes) if isinstance(sizes, (tuple, list)) else (sizes,)
        widths = meta.get("sub_param_shard_widths")
        return narrow_sub_params(view, dim, sizes, widths, tp_rank, tp, version)
    parts = meta.get("partition_sizes")
    if parts is not None:
        return view.narrow(dim, sum(parts[:tp_rank]), parts[tp_rank]).flatten()
    # AutoTP gives the remainder to the lowest ranks while an even chunk shrinks the last one;
    # without recorded sizes only an even split can be trusted
    if view.shape[dim] % tp:
        raise AssertionError(
            f"Dimension {dim} of size {view.shape[dim]} is not divisible by tp_world_size {tp}, and "
            "this checkpoint records no partition_sizes, so its uneven layout cannot be "
            "reconstructed."
        )
    return view.chunk(tp, dim=dim)[tp_rank].flatten()


def layout_rank_slice(
    entry: Mapping[str, Any], full: torch.Tensor, numel: int, tp_rank: int, tp: int
) -> torch.Tensor:
    """The flat slice of ``numel`` elements rank ``tp_rank`` of ``tp`` holds, cut the way the
    universal entry says the slices were merged."""
    if full.numel() != tp * numel:
        raise AssertionError(
            f"full param numel {full.numel()} != tensor slice numel {numel} * tp_world_size {tp}"
        )
    fused = entry.get(SUB_PARAM_SHAPE)
    dim = entry.get(CAT_DIM, 0)
    n_sub = entry.get(PARAM_N_SUB_PARAMS, 1)
    if fused:
        fdim = fused.partition_dim
        sizes = fused.shape[fdim]
        sizes = tuple(sizes) if isinstance(sizes, (tuple, list)) else (sizes,)
        shape = [sum(d) if isinstance(d, (tuple, list)) else d for d in fused.shape]
        view = full.view(shape)
        pieces, offset = [], 0
        for size in sizes:
            pieces.append(view.narrow(fdim, offset, size).chunk(tp, dim=fdim)[tp_rank])
            offset += size
        return torch.cat(pieces, dim=fdim).flatten()
    if n_sub > 1:
        subs = full.chunk(n_sub, dim=dim)
        return torch.cat([s.chunk(tp, dim=dim)[tp_rank] for s in subs], dim=dim).flatten()
    return full.chunk(tp, dim)[tp_rank].flatten()


__all__ = ["autotp_rank_slice", "layout_rank_slice", "load_entry", "narrow_sub_params"]
