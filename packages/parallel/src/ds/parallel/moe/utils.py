"""DeepSpeed's ``deepspeed.moe.utils``: telling expert parameters apart and giving them their own
optimizer groups (the engine reduces each group over its own ranks)."""

from __future__ import annotations

from typing import Any

import torch

# DeepSpeed's default cap on the elements of one expert optimizer group.
_MAX_GROUP_SIZE = 178956971


def is_moe_param(param: torch.Tensor) -> bool:
    """True for an expert parameter (DeepSpeed marks them ``allreduce=False``)."""
    return hasattr(param, "allreduce") and not param.allreduce


def split_params_into_different_moe_groups_for_optimizer(
    param_groups: Any, max_group_size: int | None = _MAX_GROUP_SIZE
) -> list[dict[str, Any]]:
    """DeepSpeed's semantics: each group loses its expert parameters; for every expert group name
    (``ep_size_<ep>``) a new group with the same hyper-parameters, ``moe: True`` and ``name`` set
    to that group name takes them (cut into groups of at most ``max_group_size`` elements),
    appended after the originals."""
    if isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif not isinstance(param_groups, list):
        raise ValueError(f"Unknown param group type of {type(param_groups)}")
    names: list[str] = []
    for group in param_groups:
        for p in group["params"]:
            if is_moe_param(p) and p.group_name not in names:
                names.append(p.group_name)
    moe_groups: list[tuple[dict[str, Any], list[torch.Tensor]]] = []
    for group in list(param_groups):
        hyper = {k: v for k, v in group.items() if k not in ("params", "name")}
        experts = {n: [] for n in names}  # type: dict[str, list[torch.Tensor]]
        dense = []
        for p in group["params"]:
            (experts[p.group_name] if is_moe_param(p) else dense).append(p)
        group["params"] = dense
        for n in names:
            moe_groups.append(({**hyper, "name": n, "moe": True}, experts[n]))
    for hyper, params in moe_groups:
        for chunk in _chunks(params, max_group_size):
            param_groups.append({**hyper, "params": chunk})
    return list(param_groups)


def _chunks(params: list[torch.Tensor], limit: int | None) -> list[list[torch.Tensor]]:
    if limit is None:
        return [params]
    out: list[list[torch.Tensor]] = []
    current: list[torch.Tensor] = []
    size = 0
    for p in params:
        if current and size + p.numel() > limit:
            out.append(current)
            current, size = [], 0
        current.append(p)
        size += p.numel()
    if current:
        out.append(current)
    return out


__all__ = ["is_moe_param", "split_params_into_different_moe_groups_for_optimizer"]
