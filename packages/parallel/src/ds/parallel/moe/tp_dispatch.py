"""Routed assignments split over the tensor-parallel ranks that share them (EP folded onto TP).

With expert parallelism folded onto tensor parallelism, every rank of a TP group holds the same
tokens and computes the same routing. Sending every (token, expert) assignment from each of them
would ship each one ``tp`` times; instead each TP rank keeps the assignments whose ordinal within
their expert's segment is its TP rank modulo ``tp`` (:func:`partition_assignments`), the expert
all-to-all carries each once, and :func:`restore_combined` all-gathers the expert outputs over
the TP group and sums them, with their router weights, into every token's row (the same on every
TP rank). The gather's backward all-reduces the (replicated) output gradient and returns each
rank its own rows.

Collectives go through ``comm`` (anything with torch.distributed's ``all_gather``,
``all_reduce``, ``get_rank`` and ``is_initialized``) on ``tp_group``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ds.interfaces.comm import ReduceOp


@dataclass
class RoutedAssignmentPayload:
    """One row per (token, expert) assignment, sorted by expert."""

    token_indices: torch.Tensor
    expert_indices: torch.Tensor
    assignment_indices: torch.Tensor  # ordinal within the expert's segment
    capacity_slots: torch.Tensor  # which of the token's top-k routes this is
    combine_weights: torch.Tensor
    drop_mask: torch.Tensor  # past the expert's capacity
    pad_mask: torch.Tensor  # padding rows
    input_splits: list[int]  # rows per destination rank
    output_splits: list[int]
    extra: dict[str, Any] = field(default_factory=dict)  # destination_ranks, num_tokens, ...


@dataclass
class RestoreContext:
    original_payload: RoutedAssignmentPayload
    local_indices: torch.Tensor
    tp_rank: int
    tp_size: int
    num_tokens: int
    counters: dict[str, int]


def assignment_ordinals_by_expert(expert_indices: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... within each run of equal expert indices."""
    n = expert_indices.numel()
    pos = torch.arange(n, device=expert_indices.device)
    if n == 0:
        return pos
    starts = torch.ones(n, dtype=torch.bool, device=pos.device)
    starts[1:] = expert_indices[1:] != expert_indices[:-1]
    first = torch.cummax(torch.where(starts, pos, torch.zeros_like(pos)), dim=0).values
    return pos - first


_ROW_FIELDS = (
    "token_indices",
    "expert_indices",
    "assignment_indices",
    "capacity_slots",
    "combine_weights",
    "drop_mask",
    "pad_mask",
)


def _rows(payload: RoutedAssignmentPayload, keep: torch.Tensor) -> RoutedAssignmentPayload:
    n = payload.token_indices.shape[0]
    picked = {name: getattr(payload, name).index_select(0, keep) for name in _ROW_FIELDS}
    extra = {
        k: v.index_select(0, keep) if torch.is_tensor(v) and v.dim() and v.shape[0] == n else v
        for k, v in payload.extra.items()
    }
    splits = list(payload.input_splits)
    dest = extra.get("destination_ranks")
    if dest is not None and splits:
        counts = torch.bincount(dest.long(), minlength=len(splits))[: len(splits)]
        splits = [int(c) for c in counts.tolist()]
    return replace(payload, **picked, input_splits=splits, output_splits=list(splits), extra=extra)


def partition_assignments(
    payload: RoutedAssignmentPayload, *, tp_group: Any = None, tp_rank: int, tp_size: int
) -> tuple[RoutedAssignmentPayload, RestoreContext]:
    """This TP rank's share of the live (not dropped, not padding) assignments, and what
    :func:`restore_combined` needs to put the outputs back."""
    live = ~payload.drop_mask & ~payload.pad_mask
    if tp_size > 1:
        live &= payload.assignment_indices.remainder(tp_size) == tp_rank
    keep = live.nonzero().flatten()
    local = _rows(payload, keep)
    num_tokens = payload.extra.get("num_tokens", 0)
    counters = {
        "assignments_total": int((~payload.drop_mask & ~payload.pad_mask).sum()),
        "assignments_local": int(keep.numel()),
        "padded": int(payload.pad_mask.sum()),
        "dropped": int(payload.drop_mask.sum()),
        "split_sum_in": sum(local.input_splits),
        "split_sum_out": sum(local.output_splits),
    }
    ctx = RestoreContext(payload, keep, tp_rank, tp_size, int(num_tokens), counters)
    return local, ctx


def dispatch_counters(ctx: RestoreContext) -> dict[str, int]:
    return dict(ctx.counters)


def _padded(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))])


def _gather(comm: Any, group: Any, t: torch.Tensor, counts: list[int]) -> torch.Tensor:
    width = max(counts)
    parts = [t.new_zeros((width, *t.shape[1:])) for _ in counts]
    comm.all_gather(parts, _padded(t, width).contiguous(), group=group)
    return torch.cat([p[:c] for p, c in zip(parts, counts, strict=True)])


class _GatherRows(torch.autograd.Function):
    """All-gather of a different number of rows per rank; backward: every rank consumes the
    same gathered tensor, so the gradient of its own rows is the sum over the group."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, comm: Any, group: Any, counts: list[int]) -> Any:
        ctx.comm, ctx.group, ctx.counts = comm, group, counts
        ctx.rank = int(comm.get_rank(group=group))
        return _gather(comm, group, t, counts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        grad = grad.contiguous().clone()
        ctx.comm.all_reduce(grad, group=ctx.group)
        first = sum(ctx.counts[: ctx.rank])
        return grad[first : first + ctx.counts[ctx.rank]], None, None, None


def _gather_rows(comm: Any, group: Any, t: torch.Tensor, tp_size: int) -> torch.Tensor:
    if tp_size <= 1 or not comm.is_initialized():
        return t
    mine = torch.tensor([t.shape[0]], dtype=torch.long, device=t.device)
    sizes = [torch.zeros_like(mine) for _ in range(tp_size)]
    comm.all_gather(sizes, mine, group=group)
    counts = [int(s) for s in sizes]
    if t.requires_grad:
        return _GatherRows.apply(t, comm, group, counts)  # type: ignore[no-any-return]
    return _gather(comm, group, t, counts)


def restore_combined(
    local_combined: torch.Tensor,
    ctx: RestoreContext,
    *,
    comm: Any,
    tp_group: Any,
    validate_coverage: bool = False,
) -> torch.Tensor:
    """``[num_tokens, H]``: every assignment's output times its router weight, summed into its
    token's row, over the outputs of all TP ranks. A token's routes are added in top-k slot
    order, so the sum does not depend on which rank computed which route."""
    p, idx = ctx.original_payload, ctx.local_indices

    def gathered(t: torch.Tensor) -> torch.Tensor:
        return _gather_rows(comm, tp_group, t, ctx.tp_size)

    outputs = gathered(local_combined)
    tokens = gathered(p.token_indices.index_select(0, idx)).long()
    slots = gathered(p.capacity_slots.index_select(0, idx)).long()
    weights = gathered(p.combine_weights.index_select(0, idx).to(local_combined.dtype))
    if validate_coverage:
        seen = [
            gathered(t.index_select(0, idx)).long()
            for t in (p.expert_indices, p.assignment_indices)
        ]
        _check_coverage(p, torch.stack([tokens, seen[0], seen[1], slots], dim=1))
    if ctx.num_tokens <= 0:
        ctx.num_tokens = int(p.token_indices.max()) + 1 if p.token_indices.numel() else 0
    out = local_combined.new_zeros((ctx.num_tokens, local_combined.shape[-1]))
    if outputs.numel() == 0:
        return out
    weighted = outputs * weights.reshape((-1,) + (1,) * (outputs.dim() - 1))
    for slot in torch.unique(slots, sorted=True).tolist():
        rows = slots == slot
        out = out.index_add(0, tokens[rows], weighted[rows])
    return out


def _check_coverage(p: RoutedAssignmentPayload, seen: torch.Tensor) -> None:
    live = ~p.drop_mask & ~p.pad_mask
    cols = (p.token_indices, p.expert_indices, p.assignment_indices, p.capacity_slots)
    want = torch.stack([c[live].long() for c in cols], dim=1)
    if seen.shape[0] != want.shape[0]:
        raise RuntimeError(
            f"restore coverage mismatch: {seen.shape[0]} assignments came back, "
            f"{want.shape[0]} were routed"
        )
    a, b = set(map(tuple, want.tolist())), set(map(tuple, seen.tolist()))
    if a != b:
        raise RuntimeError(
            f"restore coverage mismatch: missing {sorted(a - b)[:5]}, unexpected {sorted(b - a)[:5]}"
        )


_PRIME = 2_147_483_647


def _checksums(payload: RoutedAssignmentPayload) -> torch.Tensor:
    """Per field: its length and a position-weighted sum of its values modulo a prime."""
    dest = payload.extra.get("destination_ranks")
    fields = [getattr(payload, name) for name in _ROW_FIELDS]
    fields.append(dest if torch.is_tensor(dest) else payload.token_indices.new_empty(0))
    out = [sum(payload.input_splits), sum(payload.output_splits)]
    sums = []
    for t in fields:
        t = t.detach().reshape(-1)
        if t.is_floating_point():
            t = torch.nan_to_num(t.double(), posinf=3e38, neginf=-3e38).mul(1e6).round()
        words = t.long().remainder(_PRIME)
        pos = torch.arange(1, words.numel() + 1, device=words.device)
        sums.append(words.mul(pos).remainder(_PRIME).sum().remainder(_PRIME))
        out.append(words.numel())
    counts = torch.tensor(out, dtype=torch.long, device=payload.token_indices.device)
    return torch.cat([counts, torch.stack(sums)])


def assert_tp_payload_consistent(
    payload: RoutedAssignmentPayload, *, comm: Any, tp_group: Any, tp_size: int
) -> None:
    """RuntimeError when the TP ranks did not route identically (their payloads' checksums
    differ): the folded dispatch would then lose or repeat assignments."""
    if tp_size <= 1 or not comm.is_initialized():
        return
    mine = _checksums(payload)
    high, low = mine.clone(), mine.clone()
    comm.all_reduce(high, op=ReduceOp.MAX, group=tp_group)
    comm.all_reduce(low, op=ReduceOp.MIN, group=tp_group)
    if not torch.equal(high, low):
        raise RuntimeError(
            "expert-parallel routing decisions differ across tensor-parallel ranks; the folded "
            "dispatch needs every TP rank to route the same tokens the same way (same inputs, "
            "same router weights, deterministic routing)"
        )


__all__ = [
    "RestoreContext",
    "RoutedAssignmentPayload",
    "assert_tp_payload_consistent",
    "assignment_ordinals_by_expert",
    "dispatch_counters",
    "partition_assignments",
    "restore_combined",
]
