"""Tensor-parallel slices of one parameter, merged into the whole tensor a universal checkpoint
stores, and cut back into one rank's slice when it is loaded at another tensor-parallel degree.

How a parameter was cut is described by the writer's ``universal_checkpoint_info`` (regex
patterns naming replicated, averaged, row-parallel, vocabulary and fused parameters) or, on the
loading side, by each parameter's own AutoTP record. A fused parameter (query/key/value stacked
along ``partition_dim``) is cut per sub-parameter: each rank holds its piece of every
sub-parameter, with per-rank widths recorded from version 0.4 on (uneven head counts), and an
even split assumed before.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ds.interfaces.tp_layout import (
    REPLICATED,
    ROW_PARALLEL,
    SHARD_WIDTHS,
    UNSUPPORTED,
    VERSION,
    VERSION_KEY,
    VOCABULARY,
    WITH_SUB_PARAMS,
)

# the version from which fused parameters record their per-rank widths
WIDTHS_VERSION = 0.4
PARAM = "param"
CAT_DIM = "cat_dim"
VOCAB_TENSOR = "vocab_tensor"
PARAM_N_SUB_PARAMS = "param_n_sub_params"
SUB_PARAM_SHAPE = "sub_param_shape"
AVERAGED = "parameter_to_average_patterns"
TWO_SUB_PARAMS_DIM0 = "parameter_with_2_sub_params_cat_dim_0"
AFFINE_MAP = "affine_map"


@dataclass
class SubparamShape:
    """A fused parameter's layout: the names it applies to, its shape with the sizes of the
    sub-parameters (a tuple) at ``partition_dim``, and the dimension tensor parallelism cuts."""

    patterns: list[str]
    shape: tuple[tuple[int, ...] | int, ...]
    partition_dim: int


def check_conversion_supported(uc_info: Mapping[str, Any] | None) -> None:
    """Refuse parameters whose writer said their layout cannot be reassembled."""
    unsupported = (uc_info or {}).get(UNSUPPORTED) or {}
    if unsupported:
        reasons = "; ".join(f"{pattern}: {why}" for pattern, why in unsupported.items())
        raise ValueError(
            f"This checkpoint holds AutoTP parameters whose layout cannot be converted to a "
            f"universal checkpoint: {reasons}"
        )


def resolve_logical_shape(shape: Sequence[int], numel: int, name: str) -> list[int]:
    """``shape`` with its one placeholder (negative) dimension set from ``numel``."""
    holes = [i for i, d in enumerate(shape) if d is not None and d < 0]
    if not holes:
        return list(shape)
    if len(holes) != 1:
        raise AssertionError(
            f"Sub-parameter shape {list(shape)} of {name} has {len(holes)} placeholders"
        )
    known = math.prod(d for i, d in enumerate(shape) if i != holes[0])
    if known <= 0 or numel % known:
        raise AssertionError(
            f"Sub-parameter shape {list(shape)} of {name} cannot be resolved for {numel} elements"
        )
    out = list(shape)
    out[holes[0]] = numel // known
    return out


def _check_widths(
    sizes: Sequence[int], widths: Sequence[Sequence[int]], tp: int, name: str
) -> None:
    if len(widths) != len(sizes):
        raise AssertionError(
            f"Got {len(widths)} shard width entries for {len(sizes)} sub-parameters of {name}."
        )
    for size, w in zip(sizes, widths):
        if len(w) != tp:
            raise AssertionError(
                f"Sub-parameter of size {size} in {name} has {len(w)} shard widths, expected one "
                f"per tp rank ({tp})."
            )
        if sum(w) != size:
            raise AssertionError(
                f"Shard widths {list(w)} for a sub-parameter of {name} sum to {sum(w)}, expected {size}."
            )


def even_widths(sizes: Sequence[int], tp: int, name: str, version: float) -> list[list[int]]:
    """The widths of a checkpoint that predates recorded widths: it can only have been split
    evenly, so an uneven sub-parameter is refused rather than restored shifted."""
    uneven = [s for s in sizes if s % tp]
    if uneven:
        raise AssertionError(
            f"Sub-parameter sizes {uneven} of {name} are not divisible by tp_world_size {tp}, and "
            f"universal checkpoint version {version} records no {SHARD_WIDTHS}, so its uneven "
            "layout cannot be reconstructed."
        )
    return [[s // tp] * tp for s in sizes]


def _match(patterns: Sequence[str], name: str, used: set[str]) -> str | None:
    hits = [p for p in patterns if re.match(p, name)]
    if len(hits) > 1:
        raise AssertionError(f"Got more than one matching patterns={hits} for {name}")
    if hits:
        used.add(hits[0])
        return hits[0]
    return None


def _sub_params(uc_info: Mapping[str, Any], name: str, used: set[str]) -> tuple[Any, str | None]:
    for entry in uc_info.get(WITH_SUB_PARAMS) or []:
        shape = SubparamShape(**entry) if isinstance(entry, Mapping) else entry
        for p in shape.patterns:
            if re.match(p, name):
                used.add(p)
                return shape, p
    return None, None


def all_patterns(uc_info: Mapping[str, Any]) -> set[str]:
    """Every name pattern the info declares (a strict converter reports those matching no
    parameter)."""
    out: set[str] = set()
    for key in (REPLICATED, AVERAGED, ROW_PARALLEL, VOCABULARY, TWO_SUB_PARAMS_DIM0):
        out.update(uc_info.get(key) or [])
    for entry in uc_info.get(WITH_SUB_PARAMS) or []:
        out.update(entry["patterns"] if isinstance(entry, Mapping) else entry.patterns)
    return out


def _merge_fused(
    uc_info: Mapping[str, Any],
    name: str,
    slices: Sequence[torch.Tensor],
    shape: SubparamShape,
    pattern: str,
) -> tuple[torch.Tensor, SubparamShape]:
    dim = shape.partition_dim
    spec = shape.shape[dim]
    version = float(uc_info.get(VERSION_KEY, 0.0))
    tp = len(slices)
    if version >= WIDTHS_VERSION:
        sizes = tuple(spec) if isinstance(spec, (tuple, list)) else (spec,)
        recorded = uc_info.get(SHARD_WIDTHS) or {}
        if pattern not in recorded:
            raise AssertionError(
                f"Universal checkpoint version {version} records no {SHARD_WIDTHS} for {name}, "
                f"whose pattern {pattern} declares sub-parameters."
            )
        widths = [list(w) for w in recorded[pattern]]
        normalized = shape
    else:
        if isinstance(spec, (tuple, list)):
            sizes = tuple(spec)
            normalized = shape
        else:
            # older writers put the number of equal sub-parameters at partition_dim
            if any(s.dim() <= dim for s in slices):
                raise AssertionError(
                    f"Legacy sub-parameter metadata for {name} needs shaped slices"
                )
            total = sum(s.shape[dim] for s in slices)
            if spec <= 0 or total % spec:
                raise AssertionError(
                    f"Legacy sub-parameter count {spec} for {name} does not evenly divide {total}."
                )
            sizes = (total // spec,) * spec
            dims = list(shape.shape)
            dims[dim] = sizes
            normalized = SubparamShape(list(shape.patterns), tuple(dims), dim)
        widths = even_widths(sizes, tp, name, version)
    _check_widths(sizes, widths, tp, name)
    logical = [sum(d) if isinstance(d, (tuple, list)) else d for d in shape.shape]
    logical[dim] = sum(sizes)
    logical = resolve_logical_shape(logical, sum(s.numel() for s in slices), name)
    views = []
    for rank, piece in enumerate(slices):
        rank_shape = list(logical)
        rank_shape[dim] = sum(w[rank] for w in widths)
        if math.prod(rank_shape) != piece.numel():
            raise AssertionError(
                f"tp rank {rank} of {name} holds {piece.numel()} elements, but its recorded shard "
                f"widths describe a shape of {tuple(rank_shape)}."
            )
        views.append(piece.reshape(rank_shape))
    offsets = [0] * tp
    chunks = []
    for w in widths:
        for rank, view in enumerate(views):
            chunks.append(view.narrow(dim, offsets[rank], w[rank]))
            offsets[rank] += w[rank]
    return torch.cat(chunks, dim=dim), normalized


def merge_tp_param(
    uc_info: Mapping[str, Any], name: str, slices: Sequence[torch.Tensor], used: set[str]
) -> dict[str, Any] | None:
    """The universal entry (``{"param": tensor, ...layout keys}``) of one state of ``name``
    from its per-tensor-rank slices; None when no rank holds optimizer state for it. The
    patterns that matched are added to ``used``."""
    if (uc_info.get(AFFINE_MAP) or {}).get("params"):
        raise NotImplementedError(
            "checkpoints that describe their tensor-parallel layout with affine maps are not "
            "converted by ds; convert them with the layout's category patterns"
        )
    out: dict[str, Any] = {}
    fused, fused_pattern = _sub_params(uc_info, name, used)
    if _match(uc_info.get(REPLICATED) or [], name, used):
        if any(not slices[0].equal(s) for s in slices[1:]):
            raise AssertionError(f"replicated parameter {name} differs across tensor ranks")
        param = slices[0]
    elif _match(uc_info.get(AVERAGED) or [], name, used):
        param = sum(slices[1:], slices[0]) / len(slices)
    elif _match(uc_info.get(TWO_SUB_PARAMS_DIM0) or [], name, used):
        halves = [s.chunk(2, dim=0) for s in slices]
        param = torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
        out[CAT_DIM] = 0
        out[PARAM_N_SUB_PARAMS] = 2
    elif fused is not None:
        assert fused_pattern is not None
        param, out[SUB_PARAM_SHAPE] = _merge_fused(uc_info, name, slices, fused, fused_pattern)
    else:
        if not slices:
            return None
        cat_dim = 1 if _match(uc_info.get(ROW_PARALLEL) or [], name, used) else 0
        param = torch.cat(list(slices), dim=cat_dim)
        out[CAT_DIM] = cat_dim
    if _match(uc_info.get(VOCABULARY) or [], name, used):
        param = param[: uc_info["original_vocab_size"], :]
        out[VOCAB_TENSOR] = True
    out[PARAM] = param
    return out


__all__ = [
    "VERSION",
    "VERSION_KEY",
    "SubparamShape",
    "all_patterns",
    "check_conversion_supported",
    "even_widths",
    "merge_tp_param",
    "resolve_logical_shape",
]
