"""What every LR schedule shares: DeepSpeed's step counting, writing the LRs into the optimizer
(in place for tensor LRs), and the checks on the schedule parameters."""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

import torch

from ds.interfaces.errors import ConfigError

WARMUP_TYPES = ("log", "linear")


class _Schedule:
    """DeepSpeed's counting: ``last_batch_iteration`` is -1 after construction and grows by one
    per ``step()``. OneCycle and LRRangeTest set the LR of the next iteration (``_LOOKAHEAD`` 1,
    as DeepSpeed's do); the warm-up schedules that of the current one, and their floor before
    the first step, so the LR of every step equals DeepSpeed's."""

    _LOOKAHEAD = 0

    def __init__(self, optimizer: torch.optim.Optimizer, last_batch_iteration: int = -1) -> None:
        self.optimizer = optimizer
        self.last_batch_iteration = last_batch_iteration
        self._apply()

    def lr_at(self, iteration: int) -> list[float]:
        raise NotImplementedError

    def before_start(self) -> list[float]:
        return self.lr_at(0)

    def get_lr(self) -> list[float]:
        iteration = self.last_batch_iteration + self._LOOKAHEAD
        return self.before_start() if iteration < 0 else self.lr_at(iteration)

    def get_last_lr(self) -> list[Any]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def step(self, last_batch_iteration: int | None = None) -> None:
        if last_batch_iteration is None:
            last_batch_iteration = self.last_batch_iteration + 1
        self.last_batch_iteration = last_batch_iteration
        self._apply()

    def _apply(self) -> None:
        lrs = self.get_lr()
        # Checked before any group changes: a NaN, infinite or negative LR (from a schedule
        # parameter such as warmup_max_lr = NaN in the JSON) would otherwise reach the optimizer,
        # and torch's optimizers check the LR only when they are built.
        for i, lr in enumerate(lrs):
            if not 0 <= lr < math.inf:
                raise ConfigError(
                    f"{type(self).__name__} computed lr = {lr} for param group {i} at iteration "
                    f"{self.last_batch_iteration}; the LR must be finite and >= 0, so check "
                    "the scheduler's params"
                )
        for group, lr in zip(self.optimizer.param_groups, lrs):
            current = group["lr"]
            # A tensor LR (torch's capturable / compiled optimizers) is referenced by the
            # optimizer's step and often by the caller: rebinding it to a float would detach
            # them, so it is filled in place, keeping its shape, dtype and device.
            if isinstance(current, torch.Tensor):
                current.fill_(lr)
            else:
                group["lr"] = lr

    def state_dict(self) -> dict[str, Any]:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_batch_iteration = int(state["last_batch_iteration"])
        self._apply()


def per_group(optimizer: torch.optim.Optimizer, value: Any, name: str) -> list[float]:
    """One float per param group: a scalar is shared by all, a list/tuple gives each its own."""
    count = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ConfigError(
                f"{name} has {len(value)} values but the optimizer has {count} param groups; "
                "give one value per group, or a single number for all of them"
            )
        return [float(v) for v in value]
    return [float(value)] * count


def _integral(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    # JSON writers may turn 1000 into 1000.0; that is still a whole number of steps.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def positive_steps(value: Any, name: str) -> int:
    """A step count that divides the iteration: a whole number >= 1, refused otherwise."""
    steps = _integral(value)
    if steps is None or steps <= 0:
        raise ConfigError(f"{name} must be a positive whole number of steps, got {value!r}")
    return steps


def checked_warmup_type(value: Any) -> str:
    if value in WARMUP_TYPES:
        return str(value)
    # DeepSpeed trains on with its default curve here rather than refusing the config.
    warnings.warn(
        f"unknown warmup_type {value!r} (known: {', '.join(WARMUP_TYPES)}); warming up with 'log'",
        UserWarning,
        stacklevel=3,
    )
    return "log"


def warmup_gamma(iteration: int, warmup_num_steps: int, kind: str) -> float:
    """Fraction (0..1) of the warm-up done at ``iteration``."""
    if iteration >= warmup_num_steps:
        return 1.0
    if kind == "log":
        return math.log(iteration + 1) / math.log(warmup_num_steps)
    return iteration / warmup_num_steps
