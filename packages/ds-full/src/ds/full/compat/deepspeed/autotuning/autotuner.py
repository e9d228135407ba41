"""``deepspeed.autotuning.autotuner.Autotuner``: not in ds (``ds autotune`` replaces it)."""

from __future__ import annotations

from ds.full.compat.deepspeed._missing import missing_class

Autotuner = missing_class(
    "deepspeed.autotuning.autotuner.Autotuner",
    "DeepSpeed's autotuner (model profiling, per-stage experiment generation, tuner algorithms)",
    "tune with 'ds autotune SCRIPT --config ds.json' (estimates prune the search, short real "
    "trials time the rest; docs/planning.md)",
)

__all__ = ["Autotuner"]
