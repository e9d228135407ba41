"""The optimizer of an engine built without one: no ``optimizer`` section and none passed.

DeepSpeed accepts such a config; the engine then only runs the model forward (evaluation,
inference: transformers' ``Trainer.evaluate`` before any training, ZeRO-3 inference, where stage
3 partitions the parameters and gathers them around each module's forward). The stage is built
with no parameter groups, so it holds no master weights, gradient buffers or optimizer state;
this object stands where the optimizer would, holding nothing, and whatever would train refuses
with :func:`missing`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ds.interfaces.errors import ConfigError
from ds.zero.optim.base import FlatOptimizer


def missing(what: str, instead: str = "") -> ConfigError:
    """The error of ``what`` (``step()``, ``backward()``, ...) on an engine without optimizer;
    ``instead``: what serves the user without one."""
    return ConfigError(
        f"{what} needs an optimizer, and this engine was built without one (the config has no "
        "'optimizer' section and initialize() got no optimizer=), so it only runs the model "
        f"forward{'; ' + instead if instead else ''}. To train, add an 'optimizer' section "
        '(e.g. {"type": "AdamW", "params": {"lr": 1e-3}}) or pass optimizer= to initialize()'
    )


class NoOptimizer(FlatOptimizer):
    """No parameter groups, no state; ``step()`` raises :func:`missing`."""

    def __init__(self) -> None:
        super().__init__([], {})
        self.param_groups.clear()

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        raise missing("step()")

    def __repr__(self) -> str:
        return "NoOptimizer()"


def has_optimizer(optimizer: Any) -> bool:
    return not isinstance(optimizer, NoOptimizer)


__all__ = ["NoOptimizer", "has_optimizer", "missing"]
