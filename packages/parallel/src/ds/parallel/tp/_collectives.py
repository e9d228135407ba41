"""Autograd-aware tensor-parallel collectives over one group of a ds Communicator.

They call ``comm.all_reduce`` / ``comm.all_gather`` with ``group=`` the TP group, never
torch.distributed directly, so a simulated communicator works as well as the real one.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch


class TPGroup:
    """The tensor-parallel group as the layers see it: communicator, handle, size and index."""

    def __init__(self, comm: Any, group: Any, size: int, rank: int) -> None:
        self.comm = comm
        self.group = group
        self.size = size
        self.rank = rank
        # The last input copied to the group: q, k and v (gate and up) read the same tensor, and
        # sharing one copy sums their input gradients before one all-reduce instead of three.
        # It is held until the row-parallel layer (or the gather) that ends the block runs, so
        # after a forward it holds nothing.
        self._last_copy: tuple[weakref.ref[torch.Tensor], int, torch.Tensor] | None = None

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        out = t.contiguous().clone()
        if self.size > 1:
            self.comm.all_reduce(out, group=self.group)
        return out

    def all_gather_last(self, t: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return t
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.size)]
        self.comm.all_gather(parts, t, group=self.group)
        return torch.cat(parts, dim=-1)

    def __repr__(self) -> str:
        return f"TPGroup(size={self.size}, rank={self.rank})"


class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient backward (the input feeds every rank's slice)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.tp.all_reduce(grad), None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce of partial sums forward; identity backward (every rank holds the same grad)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        return tp.all_reduce(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """All-gather along the last dim forward; this rank's chunk of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        ctx.tp = tp
        ctx.width = x.shape[-1]
        return tp.all_gather_last(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        tp, w = ctx.tp, ctx.width
        return grad.narrow(-1, tp.rank * w, w).contiguous(), None


def copy_to_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    if tp.size == 1:
        return x
    if not (torch.is_grad_enabled() and x.requires_grad):
        return x  # no gradient flows back: nothing to all-reduce
    last = tp._last_copy
    if last is not None and last[0]() is x and last[1] == x._version:
        return last[2]
    out = _CopyToTP.apply(x, tp)
    tp._last_copy = (weakref.ref(x), x._version, out)
    return out


def reduce_from_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    tp._last_copy = None  # the block's column-parallel layers are done with their input
    return x if tp.size == 1 else _ReduceFromTP.apply(x, tp)


def gather_from_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    tp._last_copy = None
    return x if tp.size == 1 else _GatherFromTP.apply(x, tp)
