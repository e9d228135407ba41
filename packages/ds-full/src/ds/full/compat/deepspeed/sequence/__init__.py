"""``deepspeed.sequence``: Ulysses sequence parallelism (ds.parallel.sequence)."""

from ds.full.compat.deepspeed.sequence import layer

__all__ = ["layer"]
