"""``deepspeed.runtime.tensor_parallel``: AutoTP training settings (:mod:`ds.parallel.tp`)."""

from ds.full.compat.deepspeed.runtime.tensor_parallel.config import AUTOTP_MODE

__all__ = ["AUTOTP_MODE"]
