"""Routed assignments split over TP ranks and put back (in one process: the split, the TP=1
restore and the routing check with a stand-in communicator)."""

from __future__ import annotations

import pytest
import torch

from ds.parallel.moe.routes import combine_from_routed
from ds.parallel.moe.tp_dispatch import (
    RoutedAssignmentPayload,
    assert_tp_payload_consistent,
    assignment_ordinals_by_expert,
    dispatch_counters,
    partition_assignments,
    restore_combined,
)


def payload() -> RoutedAssignmentPayload:
    experts = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    n = experts.numel()
    return RoutedAssignmentPayload(
        token_indices=torch.tensor([0, 1, 2, 0, 3, 1, 2, 3, 4]),
        expert_indices=experts,
        assignment_indices=assignment_ordinals_by_expert(experts),
        capacity_slots=torch.arange(n),
        combine_weights=torch.linspace(0.1, 0.9, n),
        drop_mask=torch.zeros(n, dtype=torch.bool),
        pad_mask=torch.zeros(n, dtype=torch.bool),
        input_splits=[3, 2, 4],
        output_splits=[3, 2, 4],
        extra={"destination_ranks": experts, "num_tokens": torch.tensor(5)},
    )


class _NoComm:
    def is_initialized(self) -> bool:
        return False


def test_each_assignment_goes_to_one_tp_rank() -> None:
    p = payload()
    assert p.assignment_indices.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    (a, ca), (b, _) = (partition_assignments(p, tp_rank=r, tp_size=2) for r in (0, 1))
    assert (a.input_splits, b.input_splits) == ([2, 1, 2], [1, 1, 2])
    both = set(a.capacity_slots.tolist()) | set(b.capacity_slots.tolist())
    assert both == set(range(9)) and a.token_indices.numel() + b.token_indices.numel() == 9
    assert dispatch_counters(ca)["assignments_total"] == 9


def test_restore_weights_and_sums_by_token() -> None:
    p = payload()
    p.drop_mask[1] = True
    local, ctx = partition_assignments(p, tp_rank=0, tp_size=1)
    values = torch.randn(local.token_indices.numel(), 3)
    out = restore_combined(values, ctx, comm=_NoComm(), tp_group=None)
    expected = torch.zeros(5, 3).index_add(
        0, local.token_indices, values * local.combine_weights[:, None]
    )
    torch.testing.assert_close(out, expected)
    with pytest.raises(RuntimeError, match="restore coverage mismatch"):
        ctx.local_indices = ctx.local_indices[:-1]
        restore_combined(values[:-1], ctx, comm=_NoComm(), tp_group=None, validate_coverage=True)


def test_diverging_routing_is_refused() -> None:
    class SkewedComm:
        calls = 0

        def is_initialized(self) -> bool:
            return True

        def all_reduce(self, t: torch.Tensor, op: object = None, group: object = None) -> None:
            if not self.calls:
                t[-1] += 1  # the other TP rank routed differently
            self.calls += 1

    assert_tp_payload_consistent(payload(), comm=_NoComm(), tp_group=None, tp_size=2)
    with pytest.raises(RuntimeError, match="routing decisions differ"):
        assert_tp_payload_consistent(payload(), comm=SkewedComm(), tp_group=None, tp_size=2)


def test_combine_from_routed_weights_each_tokens_routes() -> None:
    out = torch.arange(8.0).reshape(4, 2)  # rows for routes 3, 0, 2, 1 of 2 tokens x top-2
    scores = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    got = combine_from_routed(
        out, scores, torch.tensor([3, 0, 2, 1]), 2, "post", "weighted_sum", (1, 2, 2)
    )
    routes = torch.stack([out[1], out[3], out[2], out[0]]).view(2, 2, 2)
    torch.testing.assert_close(got[0], (routes * scores[..., None]).sum(1))
    legacy = combine_from_routed(
        out, scores, torch.tensor([3, 0, 2, 1]), 2, "post", "legacy_bmm", (1, 2, 2)
    )
    torch.testing.assert_close(legacy, got)
    assert torch.equal(
        combine_from_routed(out, scores, torch.arange(4), 2, "pre", "", (2, 1, 2))[:, 0],
        out.view(2, 2, 2).sum(1),
    )
