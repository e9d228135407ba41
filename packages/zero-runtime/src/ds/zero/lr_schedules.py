"""The five DeepSpeed LR schedules, driving ``param_groups[i]["lr"]`` of any torch optimizer.

Each is stepped once per optimizer step (skipped steps do not advance it). ``last_batch_iteration``
counts completed steps; constructing a schedule applies the LR of step 0.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from ds.interfaces.errors import ConfigError


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

    def get_last_lr(self) -> list[float]:
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
            group["lr"] = lr

    def state_dict(self) -> dict[str, Any]:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_batch_iteration = int(state["last_batch_iteration"])
        self._apply()


def _short_warning(total: Any, warmup: Any) -> None:
    # DeepSpeed warns and trains on (decaying from the end of the warm-up); ds does the same.
    warnings.warn(
        f"scheduler.params.total_num_steps ({total}) is below warmup_num_steps ({warmup}); the "
        "schedule is at its floor after total_num_steps",
        UserWarning,
        stacklevel=3,
    )


def _warmup_gamma(iteration: int, warmup_num_steps: int, warmup_type: str) -> float:
    if iteration >= warmup_num_steps:
        return 1.0
    if warmup_type == "log":
        return math.log(iteration + 1) / math.log(warmup_num_steps)
    return iteration / warmup_num_steps


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
        self.min_lr = float(warmup_min_lr)
        # None (DeepSpeed's default): each param group warms up to its own optimizer LR.
        self.max_lrs = (
            [float(g["lr"]) for g in optimizer.param_groups]
            if warmup_max_lr is None
            else [float(warmup_max_lr)] * len(optimizer.param_groups)
        )
        self.warmup_num_steps = max(2, int(warmup_num_steps))
        self.warmup_type = warmup_type
        super().__init__(optimizer, last_batch_iteration)

    def _gamma(self, iteration: int) -> float:
        return _warmup_gamma(iteration, self.warmup_num_steps, self.warmup_type)

    def lr_at(self, iteration: int) -> list[float]:
        gamma = self._gamma(iteration)
        return [self.min_lr + (top - self.min_lr) * gamma for top in self.max_lrs]


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
        if self.total_num_steps < warmup_num_steps:
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
        self.warmup_num_steps = max(2, int(warmup_num_steps))
        self.cos_min_ratio = float(cos_min_ratio)
        self.warmup_type = warmup_type
        if self.total_num_steps < self.warmup_num_steps:
            _short_warning(total_num_steps, warmup_num_steps)
        self.base_lrs = [float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups]
        for g, lr in zip(optimizer.param_groups, self.base_lrs):
            g.setdefault("initial_lr", lr)
        super().__init__(optimizer, last_batch_iteration)

    def ratio_at(self, iteration: int) -> float:
        if iteration < self.warmup_num_steps:
            gamma = _warmup_gamma(iteration, self.warmup_num_steps, self.warmup_type)
            return self.warmup_min_ratio + (1.0 - self.warmup_min_ratio) * gamma
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


class OneCycle(_Schedule):
    """One triangular LR cycle (min -> max -> min), then decay; momentum cycles inversely."""

    _LOOKAHEAD = 1

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        cycle_min_lr: float,
        cycle_max_lr: float,
        decay_lr_rate: float = 0.0,
        cycle_first_step_size: int = 2000,
        cycle_second_step_size: int | None = None,
        cycle_first_stair_count: int = 0,
        cycle_second_stair_count: int | None = None,
        decay_step_size: int = 0,
        cycle_momentum: bool = True,
        cycle_min_mom: float = 0.8,
        cycle_max_mom: float = 0.9,
        decay_mom_rate: float = 0.0,
        last_batch_iteration: int = -1,
    ) -> None:
        self.min_lr, self.max_lr = float(cycle_min_lr), float(cycle_max_lr)
        self.decay_lr_rate = float(decay_lr_rate)
        self.first = int(cycle_first_step_size)
        self.second = int(cycle_second_step_size) if cycle_second_step_size else self.first
        self.first_stairs = int(cycle_first_stair_count)
        self.second_stairs = (
            int(cycle_second_stair_count)
            if cycle_second_stair_count is not None
            else self.first_stairs
        )
        self.decay_step_size = int(decay_step_size)
        self.cycle_momentum = bool(cycle_momentum)
        self.min_mom, self.max_mom = float(cycle_min_mom), float(cycle_max_mom)
        self.decay_mom_rate = float(decay_mom_rate)
        # As DeepSpeed: momentum cycles through Adam-style betas only; for other optimizers
        # (SGD's "momentum" included) cycle_momentum is off.
        if self.cycle_momentum and "betas" not in optimizer.param_groups[0]:
            self.cycle_momentum = False
        super().__init__(optimizer, last_batch_iteration)

    def _position(self, iteration: int) -> float | None:
        """Fraction of the way up (0..1) in the cycle, or None once the cycle is over."""
        total = self.first + self.second
        if iteration >= total:
            return None
        if iteration < self.first:
            frac = iteration / self.first
            stairs = self.first_stairs
        else:
            frac = 1.0 - (iteration - self.first) / self.second
            stairs = self.second_stairs
        if stairs:
            frac = math.floor(frac * stairs) / stairs
        return frac

    def lr_at(self, iteration: int) -> list[float]:
        frac = self._position(iteration)
        if frac is None:
            lr = self.min_lr
            if self.decay_step_size > 0:
                interval = (iteration - self.first - self.second) / self.decay_step_size
                lr = self.min_lr / (1.0 + self.decay_lr_rate * interval)
        else:
            lr = self.min_lr + (self.max_lr - self.min_lr) * frac
        return [lr for _ in self.optimizer.param_groups]

    def mom_at(self, iteration: int) -> float:
        frac = self._position(iteration)
        if frac is None:
            mom = self.max_mom
            if self.decay_step_size > 0:
                interval = (iteration - self.first - self.second) / self.decay_step_size
                mom = self.max_mom * (1.0 + self.decay_mom_rate * interval)
            return mom
        return self.max_mom - (self.max_mom - self.min_mom) * frac

    def _apply(self) -> None:
        super()._apply()
        if self.cycle_momentum:
            # Before the first step DeepSpeed sets cycle_min_mom (with cycle_min_lr).
            mom = (
                self.min_mom
                if self.last_batch_iteration < 0
                else self.mom_at(self.last_batch_iteration + self._LOOKAHEAD)
            )
            for g in self.optimizer.param_groups:
                g["betas"] = (mom, g["betas"][1])


class LRRangeTest(_Schedule):
    """LR grows from ``lr_range_test_min_lr`` by ``step_rate`` every ``step_size`` steps."""

    _LOOKAHEAD = 1

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        lr_range_test_min_lr: float = 0.001,
        lr_range_test_step_size: int = 2000,
        lr_range_test_step_rate: float = 1.0,
        lr_range_test_staircase: bool = False,
        last_batch_iteration: int = -1,
    ) -> None:
        self.min_lr = float(lr_range_test_min_lr)
        self.step_size = int(lr_range_test_step_size)
        self.step_rate = float(lr_range_test_step_rate)
        self.staircase = bool(lr_range_test_staircase)
        super().__init__(optimizer, last_batch_iteration)

    def lr_at(self, iteration: int) -> list[float]:
        interval = iteration / self.step_size
        if self.staircase:
            interval = math.floor(interval)
        lr = self.min_lr * (1.0 + self.step_rate * interval)
        return [lr for _ in self.optimizer.param_groups]


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
