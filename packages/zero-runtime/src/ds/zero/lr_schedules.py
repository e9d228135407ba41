"""The five DeepSpeed LR schedules, driving ``param_groups[i]["lr"]`` of any torch optimizer.

Each is stepped once per optimizer step (skipped steps do not advance it). ``last_batch_iteration``
counts completed steps; constructing a schedule applies the LR of step 0.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from ds.zero.lr_cycle_schedules import LRRangeTest, OneCycle
from ds.zero.lr_schedule_base import (
    _Schedule,
    checked_warmup_type,
    per_group,
    positive_steps,
    warmup_gamma,
)


def _short_warning(total: Any, warmup: Any) -> None:
    # DeepSpeed warns and trains on (decaying from the end of the warm-up); ds does the same.
    warnings.warn(
        f"scheduler.params.total_num_steps ({total}) is below warmup_num_steps ({warmup}); the "
        "schedule is at its floor after total_num_steps",
        UserWarning,
        stacklevel=3,
    )


class WarmupLR(_Schedule):
    """LR rises from ``warmup_min_lr`` to ``warmup_max_lr`` over ``warmup_num_steps`` (log or
    linear), then stays at ``warmup_max_lr``."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup_min_lr: float = 0.0,
        warmup_max_lr: float | None = None,
        warmup_num_steps: int = 1000,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ) -> None:
        # One step of warm-up is taken as two: log(1) would divide by zero.
        self.warmup_num_steps = max(2, positive_steps(warmup_num_steps, "warmup_num_steps"))
        self.min_lrs = per_group(optimizer, warmup_min_lr, "warmup_min_lr")
        # None (DeepSpeed's default): each param group warms up to its own optimizer LR.
        self.max_lrs = per_group(
            optimizer,
            [g["lr"] for g in optimizer.param_groups] if warmup_max_lr is None else warmup_max_lr,
            "warmup_max_lr",
        )
        self.warmup_type = checked_warmup_type(warmup_type)
        super().__init__(optimizer, last_batch_iteration)

    def _gamma(self, iteration: int) -> float:
        return warmup_gamma(iteration, self.warmup_num_steps, self.warmup_type)

    def lr_at(self, iteration: int) -> list[float]:
        gamma = self._gamma(iteration)
        return [lo + (hi - lo) * gamma for lo, hi in zip(self.min_lrs, self.max_lrs)]


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then linear decay to 0 at ``total_num_steps``."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_num_steps: int,
        warmup_min_lr: float = 0.0,
        warmup_max_lr: float = 0.001,
        warmup_num_steps: int = 1000,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ) -> None:
        self.total_num_steps = int(total_num_steps)
        if self.total_num_steps < positive_steps(warmup_num_steps, "warmup_num_steps"):
            _short_warning(total_num_steps, warmup_num_steps)
        super().__init__(
            optimizer,
            warmup_min_lr,
            warmup_max_lr,
            warmup_num_steps,
            warmup_type,
            last_batch_iteration,
        )

    def _gamma(self, iteration: int) -> float:
        if iteration < self.warmup_num_steps:
            return super()._gamma(iteration)
        span = max(1, self.total_num_steps - self.warmup_num_steps)
        return max(0.0, (self.total_num_steps - iteration) / span)


class WarmupCosineLR(_Schedule):
    """Warm-up to the optimizer's LR (as a ratio), then cosine decay to ``cos_min_ratio``."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_num_steps: int,
        warmup_min_ratio: float = 0.0,
        warmup_num_steps: int = 1000,
        cos_min_ratio: float = 0.0001,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ) -> None:
        self.total_num_steps = int(total_num_steps)
        self.warmup_min_ratio = float(warmup_min_ratio)
        self.warmup_num_steps = max(2, positive_steps(warmup_num_steps, "warmup_num_steps"))
        self.cos_min_ratio = float(cos_min_ratio)
        self.warmup_type = checked_warmup_type(warmup_type)
        if self.total_num_steps < self.warmup_num_steps:
            _short_warning(total_num_steps, warmup_num_steps)
        self.base_lrs = [float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups]
        for g, lr in zip(optimizer.param_groups, self.base_lrs):
            g.setdefault("initial_lr", lr)
        super().__init__(optimizer, last_batch_iteration)

    def get_lr_ratio(self) -> float:
        """The share of each group's base LR in use now (0.0 before the first step)."""
        if self.last_batch_iteration < 0:
            return 0.0
        return self.ratio_at(self.last_batch_iteration)

    def ratio_at(self, iteration: int) -> float:
        if iteration < self.warmup_num_steps:
            gamma = warmup_gamma(iteration, self.warmup_num_steps, self.warmup_type)
            return self.warmup_min_ratio + (1.0 - self.warmup_min_ratio) * gamma
        # An empty decay window (total_num_steps <= warmup_num_steps) holds the floor.
        span = max(1, self.total_num_steps - self.warmup_num_steps)
        # DeepSpeed counts the first step after the warm-up as one step of decay.
        progress = min(1.0, (iteration - self.warmup_num_steps + 1) / span)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.cos_min_ratio + (1.0 - self.cos_min_ratio) * cosine

    def lr_at(self, iteration: int) -> list[float]:
        ratio = self.ratio_at(iteration)
        return [lr * ratio for lr in self.base_lrs]

    def before_start(self) -> list[float]:
        return [0.0 for _ in self.base_lrs]  # DeepSpeed's WarmupCosineLR before its first step


SCHEDULES: dict[str, type[_Schedule]] = {
    "WarmupLR": WarmupLR,
    "WarmupDecayLR": WarmupDecayLR,
    "WarmupCosineLR": WarmupCosineLR,
    "OneCycle": OneCycle,
    "LRRangeTest": LRRangeTest,
}


def build_schedule(
    name: str, optimizer: torch.optim.Optimizer, params: dict[str, Any]
) -> _Schedule:
    return SCHEDULES[name](optimizer, **params)


__all__ = [
    "SCHEDULES",
    "LRRangeTest",
    "OneCycle",
    "WarmupCosineLR",
    "WarmupDecayLR",
    "WarmupLR",
    "build_schedule",
]
