"""The matrix layout of a flat group, for optimizers whose update needs each matrix whole (Muon):
where every parameter sits in the padded buffer, this rank's partition, and how to gather it."""

from __future__ import annotations

from typing import Any

import torch

from ds.zero.optim.muon import FlatMatrices
from ds.zero.stages.groups import Group


def bind_matrix_layouts(optimizer: Any, groups: list[Group], comm: Any, pg: Any) -> None:
    """Hand ``optimizer`` each group's layout when it asks for them (``bind_flat_layout``)."""
    bind = getattr(optimizer, "bind_flat_layout", None)
    if bind is None:
        return
    for group in groups:
        bind(group.master, matrix_layout(group, comm, pg))


def matrix_layout(group: Group, comm: Any, pg: Any) -> FlatMatrices:
    fg = group.flat
    partitioned = (group.lo, group.hi) != (0, fg.padded)
    gather = None
    if partitioned:
        assert comm is not None, "a partitioned group needs a communicator to gather it"
        group_pg = group.replica_pg if group.replica_pg is not None else pg

        def gather(part: torch.Tensor) -> torch.Tensor:
            whole = torch.empty(fg.padded, dtype=part.dtype, device=part.device)
            comm.all_gather(list(whole.split(fg.partition_numel)), part.contiguous(), group_pg)
            return whole

    return FlatMatrices(
        shapes=tuple(p.shape for p in fg.params),
        offsets=tuple(fg.offsets),
        lo=group.lo,
        hi=group.hi,
        padded=fg.padded,
        gather=gather,
    )
