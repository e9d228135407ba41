"""The layout record a tensor-parallel parameter carries for universal checkpoints, and the
model-level ``universal_checkpoint_info`` gathered from those records.

A record has two views. The restore view (everything at the top level) tells the loader how to
cut the whole tensor for this rank: the logical shape, the per-rank partition sizes, the sizes
and per-rank widths of fused sub-parameters, the shape of this rank's slice. The conversion view
(under ``conversion``) holds only what the converter needs to merge the slices of every rank,
and is the only part published in the model-level info, so the two cannot disagree about which
fields a converter may rely on. The key names are :mod:`ds.interfaces.tp_layout`'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from torch import nn

from ds.interfaces.tp_layout import (
    CONVERSION,
    ORIGINAL_VOCAB_SIZE,
    REPLICATED,
    ROW_PARALLEL,
    SHARD_WIDTHS,
    UC_META_ATTR,
    UNSUPPORTED,
    VERSION,
    VERSION_KEY,
    VOCABULARY,
    WITH_SUB_PARAMS,
)

# parameters split along their rows under these names hold a vocabulary (embedding, LM head)
_VOCAB_NAMES = ("embed", "lm_head")


def _shape(value: Any) -> tuple[Any, ...] | None:
    return None if value is None else tuple(value)


def conversion_record(
    *,
    partition_type: str,
    partition_dim: int | None = None,
    sub_param_shape: Sequence[Any] | None = None,
    sub_param_shard_widths: Any = None,
    original_shape: Sequence[int] | None = None,
    is_bias: bool = False,
    replicated: bool = False,
    unsupported_reason: str | None = None,
) -> dict[str, Any]:
    """The conversion view: how the slices of every rank merge into the whole parameter.
    ``unsupported_reason`` says why they cannot (a layout that interleaves or replicates blocks)."""
    return {
        "partition_type": partition_type,
        "partition_dim": partition_dim,
        "sub_param_shape": _shape(sub_param_shape),
        "sub_param_shard_widths": sub_param_shard_widths,
        "original_shape": _shape(original_shape),
        "is_bias": is_bias,
        "replicated": replicated,
        "unsupported_reason": unsupported_reason,
    }


def layout_record(
    *,
    partition_type: str,
    partition_dim: int | None = None,
    logical_shape: Sequence[int] | None = None,
    output_shape: Sequence[int] | None = None,
    sub_param_shape: Sequence[Any] | None = None,
    sub_param_sizes: Sequence[int] | None = None,
    sub_param_shard_widths: Any = None,
    partition_sizes: Sequence[int] | None = None,
    target_partition_shape: Sequence[int] | None = None,
    original_shape: Sequence[int] | None = None,
    is_bias: bool = False,
    replicated: bool = False,
    unsupported_reason: str | None = None,
) -> dict[str, Any]:
    """A parameter's whole record: the restore view with the conversion view nested in it.
    Shapes are stored as tuples whatever sequence they were given as."""
    return {
        VERSION_KEY: VERSION,
        "partition_type": partition_type,
        "partition_dim": partition_dim,
        "logical_shape": _shape(logical_shape),
        "output_shape": _shape(output_shape),
        "sub_param_shape": _shape(sub_param_shape),
        "sub_param_sizes": _shape(sub_param_sizes),
        "sub_param_shard_widths": sub_param_shard_widths,
        "partition_sizes": _shape(partition_sizes),
        "target_partition_shape": _shape(target_partition_shape),
        "original_shape": _shape(original_shape),
        "is_bias": is_bias,
        "replicated": replicated,
        CONVERSION: conversion_record(
            partition_type=partition_type,
            partition_dim=partition_dim,
            sub_param_shape=sub_param_shape,
            sub_param_shard_widths=sub_param_shard_widths,
            original_shape=original_shape,
            is_bias=is_bias,
            replicated=replicated,
            unsupported_reason=unsupported_reason,
        ),
    }


def mark(param: Any, **fields: Any) -> None:
    """Attach a fresh record (see :func:`layout_record`) to ``param``; None is left alone."""
    if param is not None:
        setattr(param, UC_META_ATTR, layout_record(**fields))


def conversion_view(param: Any) -> dict[str, Any] | None:
    """The conversion view of ``param``'s record, or None when it carries none."""
    meta = getattr(param, UC_META_ATTR, None)
    if not meta:
        return None
    view: dict[str, Any] | None = meta.get(CONVERSION)
    return view


def full_shape(param: Any) -> tuple[int, ...]:
    """A parameter's shape before ZeRO-3 emptied its local data (ZeRO-3 keeps it as
    ``ds_shape``)."""
    ds_shape = getattr(param, "ds_shape", None)
    return tuple(param.shape) if ds_shape is None else tuple(ds_shape)


def _published_sub_params(view: dict[str, Any]) -> tuple[list[Any], Any] | None:
    """The sub-parameter shape to publish and its per-rank widths. With widths recorded, the
    partition dimension lists the physical sizes (their sums): a view spec such as ``(3, -1)``
    holds the sub-parameter count there, which a reader could take for a width."""
    spec, dim = view.get("sub_param_shape"), view.get("partition_dim")
    if spec is None or dim is None:
        return None
    published = list(spec)
    widths = view.get("sub_param_shard_widths")
    if widths is None:
        return published, None
    published[dim] = tuple(sum(w) for w in widths)
    return published, [list(w) for w in widths]


def collect_universal_info(model: nn.Module) -> dict[str, Any]:
    """The model-level ``universal_checkpoint_info`` of ``model``'s tensor-parallel layout, one
    anchored pattern per parameter.

    A parameter without a record was left whole by tensor parallelism, so it is replicated (the
    converter would otherwise concatenate the copies of every rank). A tied parameter is named
    only under its first name, the one the optimizer and so the checkpoint know it by."""
    row, replicated, vocabulary = [], [], []
    with_sub_params: list[dict[str, Any]] = []
    widths: dict[str, list[list[int]]] = {}
    unsupported: dict[str, str] = {}
    vocab_size = None
    first_name = {id(p): n for n, p in model.named_parameters()}
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            name = f"{module_name}.{param_name}" if module_name else param_name
            if first_name.get(id(param), name) != name:
                continue
            pattern = rf"^{re.escape(name)}$"
            view = conversion_view(param)
            if not view:
                replicated.append(pattern)
                continue
            if view.get("unsupported_reason"):
                unsupported[pattern] = view["unsupported_reason"]
                continue
            if view.get("replicated"):
                replicated.append(pattern)
            if view.get("partition_type") == "row" and not view.get("is_bias", False):
                row.append(pattern)
            shape, dim = view.get("original_shape"), view.get("partition_dim")
            if shape and len(shape) == 2 and dim == 0 and any(v in name for v in _VOCAB_NAMES):
                vocabulary.append(pattern)
                vocab_size = shape[0] if vocab_size is None else vocab_size
            sub = _published_sub_params(view)
            if sub is not None:
                published, sub_widths = sub
                if sub_widths is not None:
                    widths[pattern] = sub_widths
                with_sub_params.append(
                    {"patterns": [pattern], "shape": published, "partition_dim": dim}
                )
    info: dict[str, Any] = {
        VERSION_KEY: VERSION,
        ROW_PARALLEL: sorted(set(row)),
        REPLICATED: sorted(set(replicated)),
        VOCABULARY: sorted(set(vocabulary)),
        WITH_SUB_PARAMS: with_sub_params,
        UNSUPPORTED: unsupported,
    }
    if widths:
        info[SHARD_WIDTHS] = widths
    if vocab_size is not None:
        info[ORIGINAL_VOCAB_SIZE] = vocab_size
    return info


__all__ = [
    "collect_universal_info",
    "conversion_record",
    "conversion_view",
    "full_shape",
    "layout_record",
    "mark",
]
