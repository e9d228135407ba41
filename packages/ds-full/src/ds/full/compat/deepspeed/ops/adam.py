"""``deepspeed.ops.adam``: ``DeepSpeedCPUAdam`` -> ds.ops CPUAdam (SIMD CPU kernels);
``FusedAdam`` -> torch's fused/foreach Adam with DeepSpeed's signature; ZenFlow's
``ZenFlowSelectiveAdamW`` / ``ZenFlowSelectiveAdamW_stage3`` -> ds.ops selective AdamW."""

from __future__ import annotations

from typing import Any

import torch

from ds.ops.optim.selective_adamw import SelectiveAdamW as ZenFlowSelectiveAdamW
from ds.ops.optim.selective_adamw import (
    SelectiveAdamWPartitioned as ZenFlowSelectiveAdamW_stage3,
)


class FusedAdam(torch.optim.Adam):
    """DeepSpeed's ``FusedAdam(params, lr, bias_correction, betas, eps, adam_w_mode, weight_decay,
    amsgrad, set_grad_none)`` on torch's Adam: ``adam_w_mode=True`` (the default) decouples the
    weight decay (AdamW), False adds it to the gradient (L2), as in DeepSpeed."""

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        adam_w_mode: bool = True,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        set_grad_none: bool = True,
    ) -> None:
        if not bias_correction:
            raise ValueError("FusedAdam(bias_correction=False) is not supported by ds; use True")
        if amsgrad:
            raise ValueError("FusedAdam does not support the AMSGrad variant (as in DeepSpeed)")
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            decoupled_weight_decay=adam_w_mode,
        )
        self.adam_w_mode = bool(adam_w_mode)


def __getattr__(name: str) -> Any:
    if name in ("DeepSpeedCPUAdam", "CPUAdam"):
        from ds.ops.optim.adam import CPUAdam

        return CPUAdam
    raise AttributeError(f"deepspeed.ops.adam.{name} has no ds equivalent")


__all__ = [
    "FusedAdam",
    "ZenFlowSelectiveAdamW",
    "ZenFlowSelectiveAdamW_stage3",
]  # DeepSpeedCPUAdam resolves lazily
