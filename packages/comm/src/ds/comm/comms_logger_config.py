"""The ``comms_logger`` config section (DeepSpeed-compatible keys), validated by pydantic."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class CommsLoggerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    verbose: bool = False
    prof_all: bool = True
    prof_ops: list[str] = []
    debug: bool = False


__all__ = ["CommsLoggerConfig"]
