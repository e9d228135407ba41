"""Plan a run: per-rank memory from the simulated GPU world (``ds estimate``)."""

from __future__ import annotations

from ds.autotune.estimate import Estimate, estimate
from ds.autotune.formulas import deepspeed_estimate, model_state_bytes

__all__ = ["Estimate", "deepspeed_estimate", "estimate", "model_state_bytes"]
