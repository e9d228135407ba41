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


def _route(
    gating: Callable[..., tuple[torch.Tensor, ...]],
    k: int,
    ep_group: Any,
    sparse_routes: bool,
    *args: Any,
    **kwargs: Any,
) -> tuple[Any, ...]:
    """ds's ``gating(*args)`` with the capacity agreed over ``ep_group`` (its maximum), in
    DeepSpeed's dense form or, with ``sparse_routes``, as ``[k, S]`` route tensors."""
    agree = None
    if ep_group is not None:
        from ds import comm as dist

        def agree(t: torch.Tensor) -> None:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ep_group)

    result = gating(*args, agree=agree, **kwargs)
    if not sparse_routes:
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
    args = (logits, capacity_factor, min_capacity, noisy_gate_policy, drop_tokens, use_rts)
    return _route(_gate.top1gating, 1, ep_group, sparse_routes, *args, used_token=used_token)


def top2gating(
    logits: torch.Tensor,
    capacity_factor: float,
    min_capacity: int,
    drop_tokens: bool = True,
    ep_group: Any = None,
    top2_2nd_expert_sampling: bool = True,
    sparse_routes: bool = False,
) -> tuple[Any, ...]:
    args = (logits, capacity_factor, min_capacity, drop_tokens, top2_2nd_expert_sampling)
    return _route(_gate.top2gating, 2, ep_group, sparse_routes, *args)


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
    args = (logits, k, capacity_factor, min_capacity, drop_tokens, drop_policy)
    return _route(_gate.topkgating, k, ep_group, sparse_routes, *args)


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
