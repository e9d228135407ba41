"""The names DeepSpeed's ZeRO optimizers carry, put on the optimizer a ds engine steps.

Code written for DeepSpeed reads its engine's optimizer for training state: ``loss_scale_config``
and ``loss_scaler`` (the loss scaler: ``cur_scale``, ``cur_iter``, ``scale_window``, ...),
``dynamic_loss_scale`` (whether that scale reacts to overflow), ``_global_grad_norm`` (the
last step's gradient norm), ``_get_norm_groups()`` (per-group gradient norms before the step) and,
with the optimizer offloaded at stages 1-2, ``accumulated_grads_in_cpu`` (the host gradients the
micro-steps accumulate into); at stages 1-2 ``bit16_groups_flat`` (each group's flat parameter
buffer). Each is backed by the engine's own state.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch


class HostGrads(Mapping[int, torch.Tensor]):
    """Group index -> this rank's host gradient of that group, read live from the strategy."""

    def __init__(self, strategy: Any) -> None:
        self._strategy = strategy

    def _grads(self) -> list[torch.Tensor]:
        return [shards[0] for shards in self._strategy.grad_shards_by_group()]

    def __getitem__(self, index: int) -> torch.Tensor:
        return self._grads()[index]

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self._grads())))

    def __len__(self) -> int:
        return len(self._grads())


def attach(engine: Any) -> None:
    opt = engine.optimizer
    opt.loss_scale_config = opt.loss_scaler = engine.loss_scaler
    opt.dynamic_loss_scale = engine.loss_scaler.dynamic
    opt._global_grad_norm = None  # the engine's step sets it
    opt._get_norm_groups = engine._grad_norm_groups
    if engine.config.zero.offload_optimizer_device == "cpu" and engine.config.stage in (1, 2):
        opt.accumulated_grads_in_cpu = HostGrads(engine.strategy)
    if engine.config.stage in (1, 2):
        # The flat buffers the parameters of each group are views into (one per group).
        opt.bit16_groups_flat = [g.flat.flat for g in engine.strategy.groups]


__all__ = ["HostGrads", "attach"]
