"""Whole weights out of a stage-3 module: one parameter gathered at a time."""

from __future__ import annotations

import torch

from ds.zero.stage3.partitioner import Stage3Partitioner
from ds.zero.stage3.shard import ParamStatus, shard_of


def consolidated_state_dict(
    part: Stage3Partitioner, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The module's full state dict (``stage3_gather_16bit_weights_on_model_save``). Every rank
    must call it, since it gathers; peak extra memory is one parameter."""
    out: dict[str, torch.Tensor] = {}
    for name, p in part.module.named_parameters(remove_duplicate=False):
        s = shard_of(p)
        was = s.status
        if was is not ParamStatus.AVAILABLE:
            part.gather_all([p])
        t = p.data.detach().clone()
        out[name] = t.to(dtype) if dtype is not None else t
        if was is not ParamStatus.AVAILABLE:
            part.release([p])
    for name, b in part.module.named_buffers():
        out[name] = b.detach().clone()
    return out
