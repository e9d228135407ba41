"""CPUAdagrad: Adagrad on CPU parameters through the fused native kernel."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ds.interfaces.errors import ConfigError
from ds.ops._checks import check_nonneg
from ds.ops.optim._base import CPUOptimizerBase


class CPUAdagrad(CPUOptimizerBase):
    """Adagrad with torch.optim.Adagrad's update (L2 weight decay in the gradient, optional
    ``lr_decay`` and ``initial_accumulator_value``). A sparse gradient (an embedding's)
    updates only the elements it names."""

    _state_names = ("sum",)
    _kernel = "adagrad_step"
    _takes_sparse = True

    def __init__(
        self,
        model_params: Iterable[Any],
        lr: float = 1e-2,
        eps: float = 1e-10,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        fp32_optimizer_states: bool = True,
        lr_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
    ) -> None:
        if amsgrad:
            raise ConfigError("amsgrad=True has no meaning for Adagrad; use amsgrad=False")
        defaults = {
            "lr": check_nonneg("lr", lr),
            "eps": check_nonneg("eps", eps),
            "weight_decay": check_nonneg("weight_decay", weight_decay),
            "amsgrad": False,
            "fp32_optimizer_states": bool(fp32_optimizer_states),
            "lr_decay": check_nonneg("lr_decay", lr_decay),
            "initial_accumulator_value": check_nonneg(
                "initial_accumulator_value", initial_accumulator_value
            ),
        }
        super().__init__(model_params, defaults)

    def _init_state(self, p: torch.Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        state["sum"] = self._new_state(p, group, state, fill=group["initial_accumulator_value"])

    def _hyper(self, group: dict[str, Any], step: int) -> dict[str, Any]:
        lr = group["lr"] / (1.0 + (step - 1) * group["lr_decay"])
        return {
            "lr": float(lr),
            "eps": float(group["eps"]),
            "weight_decay": float(group["weight_decay"]),
        }
