"""The dtype names a DeepSpeed config uses (``data_types``, ``communication_data_type``)."""

from __future__ import annotations

import torch

from ds.interfaces.errors import ConfigError

DTYPE_NAMES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}


def named_dtype(key: str, value: str | torch.dtype | None) -> torch.dtype | None:
    """The torch dtype ``value`` names (``"bf16"``, ``"torch.float16"``, a dtype), None for none;
    an unknown name is a ConfigError naming ``key``."""
    if value is None or value == "":
        return None
    if isinstance(value, torch.dtype):
        return value
    dtype = DTYPE_NAMES.get(str(value).lower().removeprefix("torch."))
    if dtype is None:
        raise ConfigError(f"{key}={value!r} is not a dtype; use fp32, bf16 or fp16")
    return dtype


__all__ = ["DTYPE_NAMES", "named_dtype"]
