"""The two exploratory schedules: OneCycle (one triangular LR cycle, then decay, with momentum
moving against the LR) and LRRangeTest (an LR that only grows, to find where training diverges).
Both set the LR of the next iteration, as DeepSpeed's do."""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from ds.interfaces.errors import ConfigError
from ds.zero.lr_schedule_base import _Schedule, per_group, positive_steps


def _step_size(value: Any, name: str, *, zero_ok: bool) -> float:
    # DeepSpeed takes fractional half-cycle lengths too; only the sign is checked.
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise ConfigError(f"{name} must be a number of steps {bound}, got {value!r}")
    return int(value) if float(value).is_integer() else float(value)


class OneCycle(_Schedule):
    """One triangular LR cycle (min -> max -> min), then decay; momentum cycles inversely.
    The LR and momentum bounds are a number for every param group or a list with one per group."""

    _LOOKAHEAD = 1

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        cycle_min_lr: float | list[float],
        cycle_max_lr: float | list[float],
        decay_lr_rate: float = 0.0,
        cycle_first_step_size: int = 2000,
        cycle_second_step_size: int | None = None,
        cycle_first_stair_count: int = 0,
        cycle_second_stair_count: int | None = None,
        decay_step_size: int = 0,
        cycle_momentum: bool = True,
        cycle_min_mom: float | list[float] = 0.8,
        cycle_max_mom: float | list[float] = 0.9,
        decay_mom_rate: float = 0.0,
        last_batch_iteration: int = -1,
    ) -> None:
        self.min_lrs = per_group(optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = per_group(optimizer, cycle_max_lr, "cycle_max_lr")
        self.decay_lr_rate = float(decay_lr_rate)
        # A zero first half would divide by zero; a zero second half is a ramp then decay.
        self.first = _step_size(cycle_first_step_size, "cycle_first_step_size", zero_ok=False)
        self.second = (
            self.first
            if cycle_second_step_size is None
            else _step_size(cycle_second_step_size, "cycle_second_step_size", zero_ok=True)
        )
        self.total_size = self.first + self.second
        self.step_ratio = self.first / self.total_size  # the share of the cycle spent rising
        self.first_stairs = int(cycle_first_stair_count)
        self.second_stairs = (
            int(cycle_second_stair_count)
            if cycle_second_stair_count is not None
            else self.first_stairs
        )
        self.decay_step_size = int(decay_step_size)
        self.cycle_momentum = bool(cycle_momentum)
        self.min_moms = per_group(optimizer, cycle_min_mom, "cycle_min_mom")
        self.max_moms = per_group(optimizer, cycle_max_mom, "cycle_max_mom")
        self.decay_mom_rate = float(decay_mom_rate)
        # As DeepSpeed: momentum cycles through Adam-style betas only; for other optimizers
        # (SGD's "momentum" included) cycle_momentum is off.
        if self.cycle_momentum and "betas" not in optimizer.param_groups[0]:
            self.cycle_momentum = False
        super().__init__(optimizer, last_batch_iteration)

    def _position(self, iteration: int) -> float | None:
        """Fraction of the way up (0..1) in the cycle, or None once the cycle is over."""
        if iteration >= self.total_size:
            return None
        # Steps from the cycle's floor over the half's length; with stairs the product is
        # floored before dividing, so an exact stair boundary is not lost to float roundoff.
        up: float
        if iteration < self.first:
            up, length, stairs = iteration, self.first, self.first_stairs
        else:
            up, length, stairs = self.total_size - iteration, self.second, self.second_stairs
        if stairs:
            return math.floor(up * stairs / length) / stairs
        return up / length

    def _decay_interval(self, iteration: int) -> float:
        return (iteration - self.total_size) / self.decay_step_size

    def lr_at(self, iteration: int) -> list[float]:
        frac = self._position(iteration)
        if frac is not None:
            return [lo + (hi - lo) * frac for lo, hi in zip(self.min_lrs, self.max_lrs)]
        if self.decay_step_size > 0:
            scale = 1.0 + self.decay_lr_rate * self._decay_interval(iteration)
            return [lo / scale for lo in self.min_lrs]
        return list(self.min_lrs)

    def mom_at(self, iteration: int) -> list[float]:
        """The first Adam beta of each param group at ``iteration``."""
        frac = self._position(iteration)
        if frac is not None:
            return [hi - (hi - lo) * frac for lo, hi in zip(self.min_moms, self.max_moms)]
        if self.decay_step_size > 0:
            scale = 1.0 + self.decay_mom_rate * self._decay_interval(iteration)
            return [hi * scale for hi in self.max_moms]
        return list(self.max_moms)

    def get_mom(self) -> list[tuple[float, Any]] | None:
        """The betas the next step uses, one pair per param group (the second beta is the
        optimizer's own); None when momentum does not cycle."""
        if not self.cycle_momentum:
            return None
        moms = self.mom_at(self.last_batch_iteration + self._LOOKAHEAD)
        return [(m, g["betas"][1]) for m, g in zip(moms, self.optimizer.param_groups)]

    def _apply(self) -> None:
        super()._apply()
        if self.cycle_momentum:
            # Before the first step DeepSpeed sets cycle_min_mom (with cycle_min_lr).
            moms = (
                self.min_moms
                if self.last_batch_iteration < 0
                else self.mom_at(self.last_batch_iteration + self._LOOKAHEAD)
            )
            for g, mom in zip(self.optimizer.param_groups, moms):
                g["betas"] = (mom, g["betas"][1])


class LRRangeTest(_Schedule):
    """LR grows from ``lr_range_test_min_lr`` (one for all groups, or a list with one per group)
    by ``step_rate`` every ``step_size`` steps, continuously or as a staircase."""

    _LOOKAHEAD = 1

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        lr_range_test_min_lr: float | list[float] = 0.001,
        lr_range_test_step_size: int = 2000,
        lr_range_test_step_rate: float = 1.0,
        lr_range_test_staircase: bool = False,
        last_batch_iteration: int = -1,
    ) -> None:
        self.min_lrs = per_group(optimizer, lr_range_test_min_lr, "lr_range_test_min_lr")
        self.step_size = positive_steps(lr_range_test_step_size, "lr_range_test_step_size")
        self.step_rate = float(lr_range_test_step_rate)
        self.staircase = bool(lr_range_test_staircase)
        super().__init__(optimizer, last_batch_iteration)

    def lr_at(self, iteration: int) -> list[float]:
        interval = iteration / self.step_size
        if self.staircase:
            interval = math.floor(interval)
        return [lo * (1.0 + self.step_rate * interval) for lo in self.min_lrs]


__all__ = ["LRRangeTest", "OneCycle"]
