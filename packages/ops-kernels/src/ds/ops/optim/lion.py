"""CPULion: the Lion optimizer on CPU parameters through the fused native kernel."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ds.ops._checks import check_betas, check_nonneg
from ds.ops.optim._base import CPUOptimizerBase


class CPULion(CPUOptimizerBase):
    """Lion (sign of an interpolated momentum, decoupled weight decay)."""

    _state_names = ("exp_avg",)
    _kernel = "lion_step"

    def __init__(
        self,
        model_params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        fp32_optimizer_states: bool = True,
    ) -> None:
        defaults = {
            "lr": check_nonneg("lr", lr),
            "betas": check_betas(betas),
            "weight_decay": check_nonneg("weight_decay", weight_decay),
            "fp32_optimizer_states": bool(fp32_optimizer_states),
        }
        super().__init__(model_params, defaults)

    def _init_state(self, p: torch.Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        state["exp_avg"] = self._new_state(p, group, state)

    def _hyper(self, group: dict[str, Any], step: int) -> dict[str, Any]:
        return {**self._lr_betas(group), "weight_decay": float(group["weight_decay"])}
