"""fp16 loss scaling: static, or dynamic with a back-off hysteresis."""

from __future__ import annotations

from dataclasses import InitVar, dataclass
from typing import Any


class LossScaler:
    """Scale 1.0 (bf16/fp32) or a fixed scale; never reacts to overflow except by skipping."""

    dynamic = False

    def __init__(self, scale: float = 1.0) -> None:
        self.cur_scale = float(scale)

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    @property
    def dynamic_loss_scale(self) -> bool:
        """DeepSpeed's name (its optimizers' ``loss_scale_config`` reads the scaler so)."""
        return self.dynamic

    def update(self, overflow: bool) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"cur_scale": self.cur_scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cur_scale = float(state["cur_scale"])


@dataclass(eq=False)
class DynamicLossScaler(LossScaler):
    """Halve the scale after ``hysteresis`` overflows, double it after ``window`` clean steps."""

    dynamic = True
    _STATE = ("cur_scale", "cur_hysteresis", "cur_iter", "last_overflow_iter")

    init_scale: InitVar[float] = 2.0**16
    scale_factor: float = 2.0
    scale_window: int = 1000
    min_scale: float = 1.0
    hysteresis: int = 2
    consecutive_hysteresis: bool = False

    def __post_init__(self, init_scale: float) -> None:
        super().__init__(init_scale)
        self.cur_hysteresis = self.hysteresis
        self.cur_iter = 0
        self.last_overflow_iter = -1

    def update(self, overflow: bool) -> None:
        if overflow:
            if self.hysteresis == 1 or self.cur_hysteresis == 1:
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.hysteresis
            if (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.hysteresis
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._STATE}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cur_scale = float(state["cur_scale"])
        self.cur_hysteresis = int(state.get("cur_hysteresis", self.hysteresis))
        self.cur_iter = int(state.get("cur_iter", 0))
        self.last_overflow_iter = int(state.get("last_overflow_iter", -1))


@dataclass(eq=False)
class StageZeroLossScaler(DynamicLossScaler):
    """DeepSpeed's rules for fp16 without ZeRO partitioning (its FP16_Optimizer): every overflow
    halves the scale (no hysteresis), and the scale doubles once ``scale_window`` clean steps
    have followed the step after the last overflow."""

    def update(self, overflow: bool) -> None:
        if overflow:
            self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            self.last_overflow_iter = self.cur_iter
        else:
            stable = self.cur_iter - self.last_overflow_iter - 1
            if stable > 0 and stable % self.scale_window == 0:
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1
