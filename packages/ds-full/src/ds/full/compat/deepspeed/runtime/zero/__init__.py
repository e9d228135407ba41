"""``deepspeed.runtime.zero``: the submodule transformers reaches into (``partition_parameters``)."""

from __future__ import annotations

from ds.full.compat.deepspeed.runtime.zero import partition_parameters
from ds.full.compat.deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from ds.full.compat.deepspeed.zero import GatheredParameters, Init

__all__ = ["GatheredParameters", "Init", "ZeroParamStatus", "partition_parameters"]
