"""Which strategy class serves a ZeRO stage.

Stages 0-2 live in :mod:`ds.zero.stages.partitioned`; stage 3 is provided by ``ds.zero.stage3``,
which exports ``Stage3Strategy`` (a :class:`~ds.zero.stages.base.ZeroStrategy` subclass).
"""

from __future__ import annotations

import importlib

from ds.interfaces.errors import ConfigError
from ds.zero.stages.base import ZeroStrategy


def strategy_class(stage: int) -> type[ZeroStrategy]:
    if stage in (0, 1, 2):
        from ds.zero.stages.partitioned import STAGES

        return STAGES[stage]
    if stage == 3:
        module = importlib.import_module("ds.zero.stage3")
        cls = getattr(module, "Stage3Strategy", None)
        if cls is None:
            raise ConfigError(
                "zero_optimization.stage=3 is not available in this build of ds-zero-runtime; "
                "use stage 0, 1 or 2"
            )
        return cls  # type: ignore[no-any-return]
    raise ConfigError(f"zero_optimization.stage must be 0, 1, 2 or 3, got {stage}")
