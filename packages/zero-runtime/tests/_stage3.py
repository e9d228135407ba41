"""Build the stage-3 engine the way users get it (``ZeroEngine`` from a config) for one-process
tests: a client optimizer, ``zero_optimization`` keys as keyword arguments."""

from __future__ import annotations

from typing import Any

import torch

from ds.zero.engine import ZeroEngine


def stage3(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    kernels: Any = None,
    accelerator: Any = None,
    config: dict[str, Any] | None = None,
    **zero: Any,
) -> ZeroEngine:
    """A world-1 stage-3 engine stepping ``optimizer``; every ``step()`` is a boundary."""
    cfg: dict[str, Any] = {
        "train_batch_size": 1,
        "train_micro_batch_size_per_gpu": 1,
        # The references step plain torch optimizers, which do not clip (ds, as DeepSpeed, clips
        # at 1.0 when the key is absent).
        "gradient_clipping": 0.0,
        # The references step torch optimizers outside ZeRO's tested set (SGD).
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": 3, **zero},
        **(config or {}),
    }
    return ZeroEngine(model, cfg, optimizer=optimizer, kernels=kernels, accelerator=accelerator)
