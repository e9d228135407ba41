"""Per-group fast path of the optimizer classes.

A training loop calls ``step()`` thousands of times on the same parameters. Once every parameter of
a group has state and the same step count, the addresses of the state tensors, the element counts
and the dtypes are fixed, so each step only needs the current param and grad addresses plus a few
cheap checks on the grads. Anything unusual (a missing grad, a grad of another dtype or layout, a
changed param dtype) falls back to the general path, which checks everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


@dataclass
class GroupPlan:
    params: list[torch.Tensor]  # the group's param list when the plan was made
    states: list[dict[str, Any]]
    state_ptrs: list[list[int]]  # per state name, one address per param
    state_tensors: list[list[torch.Tensor]]  # kept so the addresses stay valid
    numels: list[int]
    param_dtype: torch.dtype
    grad_dtype: torch.dtype
    codes: list[int]  # param, grad, state, low-precision copy (none)
    step: int


def make_plan(
    params: list[torch.Tensor], states: list[dict[str, Any]], names: tuple[str, ...]
) -> GroupPlan | None:
    """A plan for a group whose params all have grads and state at one step count, else None."""
    if not params or any(not s for s in states):
        return None
    steps = {s["step"] for s in states}
    pdt = params[0].dtype
    grads = [p.grad for p in params]
    if len(steps) != 1 or any(g is None for g in grads) or pdt not in _CODES:
        return None
    gdt = grads[0].dtype  # type: ignore[union-attr]
    tensors = [[s[n] for s in states] for n in names]
    sdt = tensors[0][0].dtype
    for p, g in zip(params, grads, strict=True):
        if p.dtype is not pdt or g.dtype is not gdt or not p.is_contiguous():  # type: ignore[union-attr]
            return None
    for ts in tensors:
        for t, p in zip(ts, params, strict=True):
            if (
                t.dtype is not sdt
                or not t.is_contiguous()
                or not t.is_cpu
                or t.numel() != p.numel()
            ):
                return None
    if gdt not in _CODES or sdt not in _CODES:
        return None
    return GroupPlan(
        params=list(params),
        states=states,
        state_ptrs=[[t.data_ptr() for t in ts] for ts in tensors],
        state_tensors=tensors,
        numels=[p.numel() for p in params],
        param_dtype=pdt,
        grad_dtype=gdt,
        codes=[_CODES[pdt], _CODES[gdt], _CODES[sdt], 3],
        step=steps.pop(),
    )


def plan_addresses(
    plan: GroupPlan, params: list[torch.Tensor]
) -> tuple[list[int], list[int], list[torch.Tensor]] | None:
    """(param addresses, grad addresses, grads) for this step, or None to take the general path.

    Per parameter only what can change between steps is checked: the grad object (autograd
    allocates a new one after zero_grad(set_to_none=True)), its dtype, layout and size, and the
    param's dtype, size and address. Grads are only read, so a grad that itself requires grad
    (create_graph=True) is fine; a grad always lives on its param's device (torch enforces it).
    """
    if len(params) != len(plan.params):
        return None
    pdt, gdt = plan.param_dtype, plan.grad_dtype
    pptrs: list[int] = []
    gptrs: list[int] = []
    grads: list[torch.Tensor] = []
    try:
        for p, q, n in zip(params, plan.params, plan.numels, strict=True):
            g = p.grad
            if (
                p is not q
                or g is None
                or p.dtype is not pdt
                or p.numel() != n
                or g.dtype is not gdt
                or g.numel() != n
                or not g.is_contiguous()
            ):
                return None
            pptrs.append(p.data_ptr())
            gptrs.append(g.data_ptr())  # raises for sparse layouts -> general path
            grads.append(g)
    except RuntimeError:
        return None
    return pptrs, gptrs, grads
