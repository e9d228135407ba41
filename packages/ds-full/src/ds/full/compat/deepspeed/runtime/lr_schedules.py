"""``deepspeed.runtime.lr_schedules`` -> ``ds.zero.lr_schedules`` (same names, same state dicts)."""

from __future__ import annotations

from ds.zero.lr_schedules import *  # noqa: F403  (the schedule classes, under DeepSpeed's names)
from ds.zero.lr_schedules import OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR

LR_RANGE_TEST = "LRRangeTest"
ONE_CYCLE = "OneCycle"
WARMUP_LR = "WarmupLR"
WARMUP_DECAY_LR = "WarmupDecayLR"
WARMUP_COSINE_LR = "WarmupCosineLR"
# The names DeepSpeed's config accepts as scheduler.type (accelerate matches type(obj).__name__).
VALID_LR_SCHEDULES = [LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR]

__all__ = [
    "VALID_LR_SCHEDULES",
    "OneCycle",
    "WarmupCosineLR",
    "WarmupDecayLR",
    "WarmupLR",
]
