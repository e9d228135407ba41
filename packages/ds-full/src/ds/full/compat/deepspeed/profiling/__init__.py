"""``deepspeed.profiling``: the flops profiler."""

from ds.full.compat.deepspeed.profiling import flops_profiler

__all__ = ["flops_profiler"]
