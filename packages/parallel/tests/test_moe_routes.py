"""Top-k routing for k > 2 and the sparse-route dispatch (one gather instead of dense einsums)."""

from __future__ import annotations

import pytest
import torch

from ds.parallel.moe.gate import TopKGate, topkgating
from ds.parallel.moe.routes import route_slots, routes_from_combine, sparse_decode, sparse_encode

LOGITS = torch.tensor(
    [[0.11, 0.2, 0.1, 0.3], [0.3, 0.4, 0.11, 0.1], [0.11, 0.1, 0.6, 0.5], [0.1, 0.11, 0.7, 0.8]]
)


@pytest.mark.parametrize(
    ("policy", "kept"),
    [
        ("probs", [(0, 1, 0), (1, 0, 0), (1, 1, 1), (2, 2, 0), (2, 3, 0), (3, 2, 1), (3, 3, 1)]),
        ("position", [(0, 1, 0), (0, 3, 0), (1, 0, 0), (1, 1, 1), (2, 2, 0), (2, 3, 1), (3, 2, 1)]),
    ],
)
def test_capacity_drops_by_gate_value_or_by_position(policy: str, kept: list[tuple]) -> None:
    _, combine, dispatch, counts = topkgating(LOGITS, 2, 1.0, 1, drop_policy=policy)
    assert dispatch.shape == (4, 4, 2) and counts.tolist() == [1, 2, 2, 3]
    assert sorted(map(tuple, dispatch.nonzero().tolist())) == kept
    assert torch.allclose(combine.sum(dim=(1, 2)), torch.ones(4))  # renormalised over kept


def test_sparse_dispatch_equals_the_dense_einsums() -> None:
    torch.manual_seed(0)
    tokens, experts, width, k = 12, 4, 6, 3
    _, combine, dispatch, _ = topkgating(torch.randn(tokens, experts), k, 1.0, 0)
    cap = combine.shape[-1]
    indices, locations, gates = routes_from_combine(combine, k)
    slots = route_slots(indices, locations, experts, cap)
    x = torch.randn(tokens, width)
    expected = torch.einsum("sec,sm->ecm", dispatch.float(), x)
    torch.testing.assert_close(sparse_encode(x, slots, experts, cap), expected)
    out = torch.randn(experts, cap, width)
    torch.testing.assert_close(
        sparse_decode(out.view(-1, width), slots, gates, tokens),
        torch.einsum("sec,ecm->sm", combine, out),
    )


def test_gate_routes_three_experts_per_token() -> None:
    gate = TopKGate(8, 4, k=3, min_capacity=0, capacity_factor=4.0)
    _, combine, _, _ = gate(torch.randn(5, 8))
    assert ((combine != 0).sum(dim=(1, 2)) == 3).all()
