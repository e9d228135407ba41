"""CPUAdam: Adam/AdamW on CPU parameters through the fused native kernel."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ds.interfaces.errors import ConfigError
from ds.ops._checks import check_betas, check_nonneg
from ds.ops.optim._base import CPUOptimizerBase


class CPUAdam(CPUOptimizerBase):
    """Adam with decoupled weight decay (``adamw_mode=True``, the default, i.e. AdamW) or with L2
    decay added to the gradient (``adamw_mode=False``).

    ``fp32_optimizer_states=False`` keeps the moments in the parameter dtype (bf16/fp16) to halve
    their memory; the update is always computed in fp32.
    """

    _state_names = ("exp_avg", "exp_avg_sq")
    _kernel = "adam_step"
    _takes_step = True

    def __init__(
        self,
        model_params: Iterable[Any],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        adamw_mode: bool = True,
        fp32_optimizer_states: bool = True,
    ) -> None:
        if amsgrad:
            raise ConfigError(
                "amsgrad=True is not supported by CPUAdam (the fused kernel keeps no max of the "
                "second moment); use amsgrad=False or torch.optim.AdamW(amsgrad=True)"
            )
        defaults = {
            "lr": check_nonneg("lr", lr),
            "bias_correction": bool(bias_correction),
            "betas": check_betas(betas),
            "eps": check_nonneg("eps", eps),
            "weight_decay": check_nonneg("weight_decay", weight_decay),
            "amsgrad": False,
            "adamw_mode": bool(adamw_mode),
            "fp32_optimizer_states": bool(fp32_optimizer_states),
        }
        super().__init__(model_params, defaults)

    @property
    def adam_w_mode(self) -> bool:
        """``adamw_mode`` under the attribute name DeepSpeedCPUAdam gives it."""
        return bool(self.defaults["adamw_mode"])

    def _init_state(self, p: torch.Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        state["exp_avg"] = self._new_state(p, group, state)
        state["exp_avg_sq"] = self._new_state(p, group, state)

    def _hyper(self, group: dict[str, Any], step: int) -> dict[str, Any]:
        return {
            **self._lr_betas(group),
            "eps": float(group["eps"]),
            "weight_decay": float(group["weight_decay"]),
            "adamw_mode": bool(group["adamw_mode"]),
            "bias_correction": bool(group["bias_correction"]),
        }
