"""How optimizer scalars and dtypes are written into checkpoints, for every ZeRO stage.

Sharded tensors go into checkpoint tensors; what is left of an optimizer's per-parameter state
(step counts and other scalars) travels as JSON-able objects: a tensor becomes
``{"__tensor__": values, "dtype": name}``. Stages 0-2 and stage 3 read and write the same form, so
a checkpoint moves between stages.
"""

from __future__ import annotations

from typing import Any

import torch


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (the names checkpoint metadata uses)."""
    return str(dtype).removeprefix("torch.")


def encode(value: Any) -> Any:
    """A JSON-able form of an optimizer-state value (tensors by value, on the host)."""
    if isinstance(value, torch.Tensor):
        return {"__tensor__": value.detach().cpu().tolist(), "dtype": dtype_name(value.dtype)}
    return value


def decode(value: Any) -> Any:
    """The inverse of :func:`encode` (tensors come back on the host)."""
    if isinstance(value, dict) and "__tensor__" in value:
        return torch.tensor(value["__tensor__"], dtype=getattr(torch, value["dtype"]))
    return value
