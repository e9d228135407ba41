"""Debug mode: before each collective, compare op, shapes and dtypes across the group's ranks.

Costs one extra object all-gather per collective, so it is for debugging only
(``ds.comm.configure(check_consistency=True)`` or ``DS_COMM_DEBUG=1``). A mismatch raises a
CommError naming both ranks and what each passed instead of hanging or returning garbage.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as _dist

from ds.comm._groups import group_label, group_ranks
from ds.interfaces.errors import CommError


def _describe(meta: tuple[str, list[tuple[tuple[int, ...], str]]]) -> str:
    name, tensors = meta
    parts = [f"shape {list(shape)} {dtype.replace('torch.', '')}" for shape, dtype in tensors]
    return f"{name}(" + ", ".join(parts) + ")"


def check_consistency(
    name: str, tensors: tuple[torch.Tensor, ...], group: Any, same_shape: bool
) -> None:
    meta = (name, [(tuple(t.shape), str(t.dtype)) for t in tensors])
    world = _dist.get_world_size(group)
    gathered: list[Any] = [None] * world
    _dist.all_gather_object(gathered, meta, group=group)
    ranks = group_ranks(group)
    ref = gathered[0]
    for i in range(1, world):
        other = gathered[i]
        bad = other[0] != ref[0] or len(other[1]) != len(ref[1])
        if not bad:
            for (s0, d0), (s1, d1) in zip(ref[1], other[1]):
                if d0 != d1 or (same_shape and s0 != s1):
                    bad = True
        if bad:
            raise CommError(
                f"mismatched collective on group {group_label(group)}: rank {ranks[0]} called "
                f"{_describe(ref)} but rank {ranks[i]} called {_describe(other)}; every rank "
                "must pass the same op with the same shape and dtype"
            )
