"""Host-side optimizers that step flat fp32 buffers through a KernelProvider (CPU offload)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ds.interfaces.kernels import AdagradHyper, AdamHyper, KernelProvider, LionHyper
from ds.zero.optim.base import FlatOptimizer


class _ProviderOptimizer(FlatOptimizer):
    def __init__(self, params: Any, defaults: dict[str, Any], kernels: KernelProvider) -> None:
        super().__init__(params, defaults)
        self.kernels = kernels

    def _state(self, p: torch.Tensor, keys: tuple[str, ...]) -> dict[str, Any]:
        state = self.state.setdefault(p, {})
        for k in keys:
            if k not in state:
                # The provider places the state apart from the buffers the step walks it with.
                walked = [p] if p.grad is None else [p, p.grad]
                walked += [v for v in state.values() if isinstance(v, torch.Tensor)]
                state[k] = self.kernels.new_state(p, walked)
        state["step"] = int(state.get("step", 0)) + 1
        return state


class ProviderAdam(_ProviderOptimizer):
    def __init__(
        self,
        params: Any,
        kernels: KernelProvider,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        adamw_mode: bool = True,
        bias_correction: bool = True,
    ) -> None:
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "adamw_mode": adamw_mode,
            "bias_correction": bias_correction,
        }
        super().__init__(params, defaults, kernels)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            hyper = AdamHyper(
                lr=group["lr"],
                beta1=group["betas"][0],
                beta2=group["betas"][1],
                eps=group["eps"],
                weight_decay=group["weight_decay"],
                adamw_mode=group["adamw_mode"],
                bias_correction=group["bias_correction"],
            )
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._state(p, ("exp_avg", "exp_avg_sq"))
                self.kernels.adam_step(
                    int(state["step"]), hyper, p, p.grad, state["exp_avg"], state["exp_avg_sq"]
                )
        return loss


class ProviderAdagrad(_ProviderOptimizer):
    """Adagrad as torch.optim.Adagrad: the kernels step ``lr / (1 + (step - 1) * lr_decay)`` and
    the sum starts at ``initial_accumulator_value``."""

    def __init__(
        self,
        params: Any,
        kernels: KernelProvider,
        lr: float = 1e-2,
        eps: float = 1e-10,
        weight_decay: float = 0.0,
        lr_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
    ) -> None:
        defaults = {
            "lr": lr,
            "eps": eps,
            "weight_decay": weight_decay,
            "lr_decay": lr_decay,
            "initial_accumulator_value": initial_accumulator_value,
        }
        super().__init__(params, defaults, kernels)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                fresh = "sum" not in self.state.get(p, {})
                state = self._state(p, ("sum",))
                if fresh and group["initial_accumulator_value"]:
                    state["sum"].fill_(group["initial_accumulator_value"])
                step = int(state["step"])
                hyper = AdagradHyper(
                    lr=group["lr"] / (1 + (step - 1) * group["lr_decay"]),
                    eps=group["eps"],
                    weight_decay=group["weight_decay"],
                )
                self.kernels.adagrad_step(step, hyper, p, p.grad, state["sum"])
        return loss


class ProviderLion(_ProviderOptimizer):
    def __init__(
        self,
        params: Any,
        kernels: KernelProvider,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(
            params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay}, kernels
        )

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            hyper = LionHyper(
                lr=group["lr"],
                beta1=group["betas"][0],
                beta2=group["betas"][1],
                weight_decay=group["weight_decay"],
            )
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._state(p, ("exp_avg",))
                self.kernels.lion_step(int(state["step"]), hyper, p, p.grad, state["exp_avg"])
        return loss
