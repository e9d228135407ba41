"""A ``torch.optim.Optimizer`` that a training framework (HF Trainer, Lightning, Fabric) can hold
in place of the engine's optimizer.

Frameworks want an optimizer object: LR schedulers and LR monitors read and write its
``param_groups``, and the loop calls ``step`` and ``zero_grad``. The engine steps its own
(sharded) optimizer at its accumulation boundaries, so this view shares the engine optimizer's
groups and state, evaluates a closure in ``step`` and does nothing else there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ds.zero.optim.base import empty_hook_tables


class EngineOptimizerView(torch.optim.Optimizer):
    def __init__(self, engine: Any) -> None:
        # Deliberately not calling Optimizer.__init__: the groups belong to the engine's optimizer.
        self.engine = engine
        self.defaults = dict(getattr(engine.optimizer, "defaults", {}))
        empty_hook_tables(self)

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        groups: list[dict[str, Any]] = self.engine.optimizer.param_groups
        return groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.engine.optimizer.state

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        return closure() if closure is not None else None  # the engine steps in backward/step

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None  # the engine clears its gradients after each step

    def state_dict(self) -> dict[str, Any]:
        return {}  # optimizer state is saved by the engine's sharded checkpoint

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        return None
