"""Sparse routes: the gate's decisions as one (expert, slot, weight) triple per token and route.

The dense gate output ``combine_weights [S, E, C]`` is mostly zeros: each token fills at most k
of its ``E * C`` entries. As ``[k, S]`` route tensors (expert index, ``-1`` for a route dropped
at capacity; slot; weight) the dispatch into the ``[E, C, M]`` expert buffer is one gather and
the combine one gather and a weighted sum, instead of einsums over the dense tensor.
"""

from __future__ import annotations

import torch


def routes_from_combine(
    combine_weights: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(indices, locations, gates)``, each ``[k, S]``, of a dense ``[S, E, C]`` gate output;
    a token with fewer than k kept routes gets expert ``-1`` (slot 0, weight 0) for the rest."""
    num_tokens, _, cap = combine_weights.shape
    flat = combine_weights.reshape(num_tokens, -1)
    routed = (flat != 0).to(torch.int8)
    order = torch.topk(routed, k=k, dim=1, sorted=True)[1]  # routed entries first
    kept = routed.gather(1, order).bool()
    expert = torch.where(kept, order // cap, torch.full_like(order, -1))
    slot = torch.where(kept, order % cap, torch.zeros_like(order))
    gate = flat.gather(1, order) * kept
    return (
        expert.t().contiguous().to(torch.int32),
        slot.t().contiguous().to(torch.int32),
        gate.t().contiguous(),
    )


def route_slots(
    indices: torch.Tensor, locations: torch.Tensor, num_experts: int, capacity: int
) -> torch.Tensor:
    """Each route's row in the flattened ``[E * C]`` expert buffer; dropped routes (expert -1)
    point at one extra row past the end, which callers discard."""
    row = indices.long() * capacity + locations.long()
    return torch.where(indices >= 0, row, torch.full_like(row, num_experts * capacity))


def sparse_encode(
    tokens: torch.Tensor, slots: torch.Tensor, num_experts: int, capacity: int
) -> torch.Tensor:
    """The ``[E, C, M]`` expert buffer: every slot holds the token routed to it (zeros where no
    token is)."""
    num_tokens, width = tokens.shape
    source = torch.full(
        (num_experts * capacity + 1,), num_tokens, dtype=torch.long, device=slots.device
    )
    token_ids = torch.arange(num_tokens, device=slots.device).expand_as(slots)
    source.scatter_(0, slots.reshape(-1), token_ids.reshape(-1))
    padded = torch.cat([tokens, tokens.new_zeros(1, width)])
    return padded.index_select(0, source[:-1]).view(num_experts, capacity, width)


def sparse_decode(
    expert_output: torch.Tensor, slots: torch.Tensor, gates: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """Each token's expert outputs (``expert_output [E * C, M]``) summed with its route weights;
    the sum runs in the weights' precision (fp32) and is cast back once."""
    width = expert_output.shape[-1]
    padded = torch.cat([expert_output, expert_output.new_zeros(1, width)])
    rows = padded.index_select(0, slots.reshape(-1)).view(slots.shape[0], num_tokens, width)
    return (rows * gates.unsqueeze(-1)).sum(0).to(expert_output.dtype)


def combine_from_routed(
    expert_output: torch.Tensor,
    top_scores: torch.Tensor,
    token_indices_sorted: torch.Tensor,
    top_k: int,
    score_apply: str,
    combine_impl: str,
    shape: tuple[int, int, int],
) -> torch.Tensor:
    """``[B, S, H]`` from the expert outputs of the routes sorted by expert: row ``i`` belongs to
    route ``token_indices_sorted[i]`` of the flattened ``[B * S, top_k]`` routes. With
    ``score_apply="post"`` each token's routes are weighted by ``top_scores`` (in fp32) and
    summed; with "pre" the experts already applied them and the routes are only summed.
    ``combine_impl="legacy_bmm"`` does the weighted sum as one batched matmul."""
    bsz, seq, hidden = shape
    tokens = bsz * seq
    routes = expert_output.new_zeros((tokens * top_k, hidden))
    routes = routes.index_copy(0, token_indices_sorted.long(), expert_output)
    routes = routes.view(tokens, top_k, hidden)
    if score_apply != "post":
        out = routes.sum(dim=1)
    elif combine_impl == "legacy_bmm":
        out = torch.bmm(top_scores.reshape(tokens, 1, top_k).float(), routes.float()).squeeze(1)
    else:
        out = (routes * top_scores.reshape(tokens, top_k, 1).float()).sum(dim=1)
    return out.to(expert_output.dtype).view(bsz, seq, hidden)


__all__ = [
    "combine_from_routed",
    "route_slots",
    "routes_from_combine",
    "sparse_decode",
    "sparse_encode",
]
