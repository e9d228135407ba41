"""Shared machinery of the CPU optimizer classes: state creation, batching, state_dict dtypes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any

import torch

from ds.interfaces.errors import ConfigError, KernelError

Batch = tuple[list[torch.Tensor], list[torch.Tensor], list[dict[str, Any]]]


class CPUOptimizerBase(torch.optim.Optimizer):
    """Collects the params of each group that have grads and hands them to the native kernel in
    one call per (step count, dtypes) batch, so a list of many tensors costs one thread-pool
    dispatch rather than one per tensor."""

    #: names of the per-parameter state tensors, in kernel argument order
    _state_names: tuple[str, ...] = ()

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.device.type != "cpu":
                    raise KernelError(
                        f"{type(self).__name__} updates CPU parameters; got one on {p.device}. "
                        "Keep the master parameters on CPU (ZeRO offload) or use a GPU optimizer."
                    )

    # -- subclass hooks -------------------------------------------------------------------------
    def _init_state(self, p: torch.Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _run(
        self,
        group: dict[str, Any],
        step: int,
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
        states: list[list[torch.Tensor]],
    ) -> None:
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------------
    def _state_dtype(self, p: torch.Tensor, group: dict[str, Any]) -> torch.dtype:
        return torch.float32 if group["fp32_optimizer_states"] else p.dtype

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            batches: dict[tuple[Any, ...], Batch] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise KernelError(
                        f"{type(self).__name__} does not take sparse gradients; densify them "
                        "(grad.to_dense()) or use torch.optim.SparseAdam"
                    )
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    self._init_state(p, group, state)
                state["step"] += 1
                key = (state["step"], p.dtype, grad.dtype)
                batch = batches.setdefault(key, ([], [], []))
                batch[0].append(p.detach())
                batch[1].append(grad.detach().contiguous())
                batch[2].append(state)
            for (step, _, _), (params, grads, states) in batches.items():
                per_name = [[s[name] for s in states] for name in self._state_names]
                self._run(group, step, params, grads, per_name)
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # torch casts floating-point state to the param dtype on load; fp32 moments of bf16/fp16
        # params would lose their precision, so the saved tensors are restored as they were.
        saved = {k: dict(v) for k, v in state_dict["state"].items()}
        super().load_state_dict(state_dict)
        ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        for pid, p in zip(ids, params, strict=True):
            for k, v in saved.get(pid, {}).items():
                if isinstance(v, torch.Tensor):
                    self.state[p][k] = v.detach().to("cpu", copy=True).contiguous()


def check_betas(betas: tuple[float, float]) -> tuple[float, float]:
    b1, b2 = (float(b) for b in betas)
    for i, b in enumerate((b1, b2)):
        if not 0.0 <= b < 1.0:
            raise ConfigError(f"betas[{i}] = {b} is outside [0, 1); use e.g. betas=(0.9, 0.999)")
    return b1, b2


def check_nonneg(name: str, value: float) -> float:
    if value < 0.0:
        raise ConfigError(f"{name} = {value} must be >= 0")
    return float(value)
