"""Expert parallelism folded onto tensor parallelism: the TP ranks of a group share the routes.

Every rank of a tensor-parallel group holds the same tokens and routes them the same way (the
router is replicated). Sending every (token, expert) route from each of them would compute each
route ``tp`` times and count its gradient ``tp`` times. Instead, in each expert's run of routes
(sorted by expert), TP rank ``r`` sends the routes whose ordinal is ``r`` modulo ``tp``
(:meth:`TPFold.shares`), the expert all-to-all carries each route once, and :meth:`TPFold.gather`
puts every rank's outputs back into the full, identical-on-every-TP-rank list of routes.

The gradients follow Megatron's two conjugate operators, so that every replicated parameter ends
the backward with the same, complete gradient on each TP rank and experts get each route's
gradient exactly once:

* :meth:`TPFold.gather` (all-gather forward) returns in backward only the rows this rank sent:
  the output gradient is the same on every TP rank, so its own rows are the whole gradient of
  the routes it computed;
* :meth:`TPFold.share_input` (identity forward) sums its input's gradient over the TP group in
  backward: each rank's routes carry only their part of the gradient of the tokens they read.

The data-parallel reduction is then the usual one: dense parameters averaged over the dense
data-parallel group, experts summed over their expert-data-parallel group and divided by the
dense data-parallel size (each route of a logical batch reached exactly one copy of its expert).
"""

from __future__ import annotations

from typing import Any

import torch

from ds.parallel.tp._collectives import TPGroup, copy_to_tp

from .tp_dispatch import assignment_ordinals_by_expert


class _GatherShares(torch.autograd.Function):
    """Every TP rank's rows (``counts[r]`` each) concatenated in rank order; backward: this
    rank's own rows of the gradient, no communication."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, tp: TPGroup, counts: list[int]) -> torch.Tensor:
        ctx.first = sum(counts[: tp.rank])
        ctx.count = counts[tp.rank]
        width = max(counts)
        mine = t.contiguous()
        if mine.shape[0] < width:
            mine = torch.cat([mine, mine.new_zeros((width - mine.shape[0], *mine.shape[1:]))])
        parts = [mine.new_empty(mine.shape) for _ in counts]
        tp.comm.all_gather(parts, mine, group=tp.group)
        return torch.cat([p[:c] for p, c in zip(parts, counts, strict=True)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad[ctx.first : ctx.first + ctx.count], None, None


class TPFold:
    """One expert layer's view of its tensor-parallel group (``tp_size > 1``)."""

    def __init__(self, comm: Any, tp_group: Any, tp_rank: int, tp_size: int) -> None:
        self.tp = TPGroup(comm, tp_group, int(tp_size), int(tp_rank))

    @property
    def rank(self) -> int:
        return self.tp.rank

    @property
    def size(self) -> int:
        return self.tp.size

    def shares(self, sorted_experts: torch.Tensor) -> list[torch.Tensor]:
        """Positions (in the expert-sorted route list) each TP rank sends, by TP rank."""
        ordinal = assignment_ordinals_by_expert(sorted_experts).remainder(self.size)
        return [(ordinal == r).nonzero().flatten() for r in range(self.size)]

    def share_input(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` as the routes read it: its gradient is summed over the TP group."""
        return copy_to_tp(t, self.tp)

    def gather(self, mine: torch.Tensor, shares: list[torch.Tensor]) -> torch.Tensor:
        """The outputs of every route, in expert-sorted order, from each rank's ``mine`` (the
        outputs of its share, in share order)."""
        self.tp._last_copy = None  # the layer is done with its inputs: hold no graph past it
        counts = [int(s.numel()) for s in shares]
        every = _GatherShares.apply(mine, self.tp, counts)
        where = torch.cat(shares)
        out = every.new_zeros((where.numel(), *every.shape[1:]))
        return out.index_copy(0, where, every)

    def __repr__(self) -> str:
        return f"TPFold(size={self.size}, rank={self.rank})"


__all__ = ["TPFold"]
