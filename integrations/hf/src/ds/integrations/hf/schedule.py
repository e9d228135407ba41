"""The Trainer's view of the engine's own learning-rate schedule (a config ``scheduler`` section).

With DeepSpeed, transformers hands such a section to DeepSpeed, whose engine builds the schedule and
steps it at every optimizer step; the Trainer's ``lr_scheduler.step()`` does nothing. ds does the
same: the engine steps its schedule, and this object only reports and checkpoints it.
"""

from __future__ import annotations

from typing import Any


class EngineSchedule:
    """What the Trainer holds as ``lr_scheduler`` when the config has a ``scheduler`` section."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    @property
    def _schedule(self) -> Any:
        return self.engine.lr_scheduler

    def step(self, *args: Any, **kwargs: Any) -> None:
        # The engine already stepped the schedule in engine.step(), at the optimizer step.
        return None

    def get_last_lr(self) -> list[float]:
        return list(self._schedule.get_last_lr())

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = self._schedule.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._schedule.load_state_dict(state)
