"""Load a checkpoint saved at another tensor-parallel size.

A rank of a TP=S layout saves its tensors under ``<key>@tp<i>of<S>`` (module weights, fp32
masters, optimizer moments: each the rank's slice, flattened) and the layout
``tensor_parallel_layout`` (parameter name -> split dim and fused segments) in the objects.
Loading at TP=T reads every saved slice of each sliced tensor whole, joins them along the split
dim and cuts this rank's T-slice; replicated tensors are read from TP rank 0's copy. Keys saved
without a suffix (rows of stacked expert tensors, named alike on every TP rank) are read as they
are. The checkpoint engine then serves only the elements of this rank's data-parallel partition.

The join reads whole tensors on each rank: memory for the largest tensor, not for the model.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from ds.interfaces.checkpoint import LoadRequest, ShardedStateDict, ShardedTensor, TensorMeta
from ds.interfaces.parallel import join_slices, split_slice

_SUFFIX = re.compile(r"^(.*)@tp(\d+)of(\d+)$")


def saved_tp_size(meta: dict[str, TensorMeta]) -> int:
    sizes = {int(m.group(3)) for k in meta if (m := _SUFFIX.match(k))}
    return max(sizes) if sizes else 1


def unsuffixed(meta: dict[str, TensorMeta]) -> set[str]:
    """Keys of a checkpoint saved with tensor parallelism that carry no TP suffix: one tensor
    for every TP rank (the rows of stacked expert tensors, :mod:`ds.interfaces.moe`)."""
    return {k for k in meta if not _SUFFIX.match(k)}


def param_of(key: str) -> str:
    """The parameter (or buffer) name a checkpoint key stores state of."""
    head, _, rest = key.partition(".")
    if head == "optim":
        return rest.partition(".")[2]
    return rest


def _saved_key(key: str, index: int, size: int) -> str:
    return f"{key}@tp{index}of{size}" if size > 1 else key


def read_resharded(
    ckpt: Any,
    load_dir: str,
    tag: str,
    meta: dict[str, TensorMeta],
    *,
    layout: dict[str, tuple[int, int]],
    shapes: dict[str, tuple[int, ...]],
    tp_size: int,
    tp_index: int,
    make_requests: Callable[[dict[str, TensorMeta]], list[LoadRequest]],
) -> ShardedStateDict:
    """This rank's state at TP=``tp_size`` (index ``tp_index``) from a checkpoint of another TP
    size. ``layout``: split dim and fused segments of each sliced parameter; ``shapes``: this
    rank's local shapes; ``make_requests``: the engine's requests for a metadata mapping."""
    saved = saved_tp_size(meta)
    logical: dict[str, TensorMeta] = {}
    for key, m in meta.items():
        match = _SUFFIX.match(key)
        name = match.group(1) if match else key
        if match and int(match.group(2)) != 0:
            continue
        shape = shapes.get(param_of(name), m.shape)
        logical[name] = TensorMeta(name, shape, m.dtype)
    requests = make_requests(logical)

    def source(name: str) -> str:  # the saved key of a tensor not split by TP
        return name if name in meta else _saved_key(name, 0, saved)

    reads: list[LoadRequest] = []
    for r in requests:
        split = layout.get(param_of(r.name))
        if split is None:
            reads.append(LoadRequest(source(r.name), r.offset, r.numel))
        else:
            for i in range(saved):
                key = _saved_key(r.name, i, saved)
                reads.append(LoadRequest(key, 0, meta[key].numel))
    state: ShardedStateDict = ckpt.load(load_dir, tag, reads, rank_objects=True)
    out: dict[str, ShardedTensor] = {}
    for r in requests:
        split = layout.get(param_of(r.name))
        if split is None:
            got = state.tensors[source(r.name)]
            local = got.local
        else:
            dim, fused = split
            pieces = [
                state.tensors[key].local.reshape(meta[key].shape)
                for key in (_saved_key(r.name, i, saved) for i in range(saved))
            ]
            whole = join_slices(pieces, dim, fused)
            mine = split_slice(whole, dim, tp_size, tp_index, fused).reshape(-1)
            local = mine[r.offset : r.offset + r.numel].clone()
        out[r.name] = ShardedTensor(logical[r.name], r.offset, local)
    state.tensors = out
    return state


def layout_of(module: torch.nn.Module) -> dict[str, tuple[int, int]]:
    from ds.interfaces.parallel import tp_dim, tp_fused

    return {
        name: (dim, tp_fused(p))
        for name, p in module.named_parameters()
        if (dim := tp_dim(p)) is not None
    }


__all__ = ["layout_of", "param_of", "read_resharded", "saved_tp_size", "unsuffixed"]
