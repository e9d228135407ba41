"""ZeRO stages as pluggable optimizer-side strategies (see :mod:`ds.zero.stages.base`)."""

from ds.zero.stages.base import StepReport, StrategyContext, ZeroStrategy

__all__ = ["StepReport", "StrategyContext", "ZeroStrategy"]
