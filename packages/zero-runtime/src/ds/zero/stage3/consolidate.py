"""Whole weights out of a stage-3 module: one parameter gathered at a time."""

from __future__ import annotations

import torch

from ds.zero.stage3.partitioner import Stage3Partitioner
from ds.zero.stage3.shard import ParamStatus, shard_of


def consolidated_state_dict(
    part: Stage3Partitioner, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The module's full state dict (``stage3_gather_16bit_weights_on_model_save``). Every rank
    must call it, since it gathers; peak extra memory is one parameter.

    The keys are ``module.state_dict()``'s: a tied parameter (a Llama's ``lm_head`` and
    ``embed_tokens``) is one tensor under each of its names, gathered once, so ``save_pretrained``
    writes it once, as for a model that never was partitioned; non-persistent buffers (rotary
    frequencies) are left out."""
    out: dict[str, torch.Tensor] = {}
    first: dict[int, str] = {}
    for name, p in part.module.named_parameters(remove_duplicate=False):
        if id(p) in first:
            out[name] = out[first[id(p)]]
            continue
        first[id(p)] = name
        s = shard_of(p)
        was = s.status
        if was is not ParamStatus.AVAILABLE:
            part.gather_all([p])
        t = p.data.detach().clone()
        out[name] = t.to(dtype) if dtype is not None else t
        if was is not ParamStatus.AVAILABLE:
            part.release([p])
    for prefix, m in part.module.named_modules(remove_duplicate=False):
        for name, b in m._buffers.items():
            if b is not None and name not in m._non_persistent_buffers_set:
                out[f"{prefix}.{name}" if prefix else name] = b.detach().clone()
    return out
