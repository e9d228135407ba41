"""``deepspeed.autotuning``: DeepSpeed's experiment-based autotuner. ds tunes with ``ds autotune``
(memory estimates prune the search, short real trials time the rest); see docs/planning.md."""

from __future__ import annotations

from ds.full.compat.deepspeed.autotuning.autotuner import Autotuner

__all__ = ["Autotuner"]
