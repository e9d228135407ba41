"""``deepspeed.moe.sharded_moe``: the gate and the layer of ds's mixture of experts
(:mod:`ds.parallel.moe`): ``TopKGate``, ``MOELayer``, ``top1gating``, ``top2gating``,
``topkgating``, ``gumbel_rsample``, ``multiplicative_jitter`` and the sparse-route dispatch
helpers.

The gating functions take DeepSpeed's argument order. ``ep_group`` (with ``drop_tokens=False``)
makes the expert-parallel group agree on the capacity (its maximum over the group);
``sparse_routes=True`` returns ``(l_aux, capacity, num_experts, indices, locations, gates,
exp_counts)`` with ``[k, S]`` route tensors instead of the dense combine weights and mask.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ds.parallel.moe import gate as _gate
from ds.parallel.moe.gate import TopKGate, gumbel_rsample, multiplicative_jitter
from ds.parallel.moe.layer import MOELayer
from ds.parallel.moe.routes import route_slots as _route_slots
from ds.parallel.moe.routes import routes_from_combine
from ds.parallel.moe.routes import sparse_decode as _sparse_decode
from ds.parallel.moe.routes import sparse_encode as _sparse_encode


def _agree(ep_group: Any) -> Callable[[torch.Tensor], None] | None:
    if ep_group is None:
        return None
    from ds import comm as dist

    def agree(t: torch.Tensor) -> None:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ep_group)

    return agree


def _out(result: tuple[torch.Tensor, ...], k: int, sparse: bool) -> tuple[Any, ...]:
    if not sparse:
        return result
    l_aux, combine, _, counts = result
    indices, locations, gates = routes_from_combine(combine, k)
    return l_aux, combine.shape[-1], combine.shape[1], indices, locations, gates, counts


def top1gating(
    logits: torch.Tensor,
    capacity_factor: float,
    min_capacity: int,
    used_token: torch.Tensor | None = None,
    noisy_gate_policy: str | None = None,
    drop_tokens: bool = True,
    use_rts: bool = True,
    ep_group: Any = None,
    sparse_routes: bool = False,
    use_tutel: bool = False,
) -> tuple[Any, ...]:
    result = _gate.top1gating(
        logits,
        capacity_factor,
        min_capacity,
        noisy_gate_policy,
        drop_tokens,
        use_rts,
        _agree(ep_group),
        used_token,
    )
    return _out(result, 1, sparse_routes)


def top2gating(
    logits: torch.Tensor,
    capacity_factor: float,
    min_capacity: int,
    drop_tokens: bool = True,
    ep_group: Any = None,
    top2_2nd_expert_sampling: bool = True,
    sparse_routes: bool = False,
) -> tuple[Any, ...]:
    result = _gate.top2gating(
        logits,
        capacity_factor,
        min_capacity,
        drop_tokens,
        top2_2nd_expert_sampling,
        _agree(ep_group),
    )
    return _out(result, 2, sparse_routes)


def topkgating(
    logits: torch.Tensor,
    k: int,
    capacity_factor: float,
    min_capacity: int,
    drop_tokens: bool = True,
    ep_group: Any = None,
    drop_policy: str = "probs",
    sparse_routes: bool = False,
) -> tuple[Any, ...]:
    result = _gate.topkgating(
        logits, k, capacity_factor, min_capacity, drop_tokens, drop_policy, _agree(ep_group)
    )
    return _out(result, k, sparse_routes)


__all__ = [
    "MOELayer",
    "TopKGate",
    "_route_slots",
    "_sparse_decode",
    "_sparse_encode",
    "gumbel_rsample",
    "multiplicative_jitter",
    "top1gating",
    "top2gating",
    "topkgating",
]
