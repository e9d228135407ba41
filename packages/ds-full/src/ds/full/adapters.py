"""What framework adapters (ds.integrations.hf, ds.integrations.lightning) reach through the
``ds.initialize`` entry-point group, so that they depend on ds.interfaces only.

Every name here is registered in ds-full's pyproject under ``[project.entry-points."ds.initialize"]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ds.full.training import initialize

__all__ = [
    "consolidated_state_dict",
    "gathered_parameters",
    "initialize",
    "load_state_dict_into_shards",
    "zero_init",
]


def zero_init(**kwargs: Any) -> Any:
    """``ds.zero.Init(**kwargs)``: modules built inside are partitioned as they are created."""
    from ds.zero.init import Init

    return Init(**kwargs)


def gathered_parameters(
    params: torch.nn.Parameter | Iterable[torch.nn.Parameter], modifier_rank: int | None = None
) -> Any:
    """``ds.zero.GatheredParameters``: whole parameters inside the block (every rank enters)."""
    from ds.zero.init import GatheredParameters

    return GatheredParameters(params, modifier_rank=modifier_rank)


def load_state_dict_into_shards(
    module: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True
) -> list[str]:
    """Each rank copies only its own slice of every partitioned parameter from a full dict."""
    from ds.zero.init import load_state_dict_into_shards as load

    return load(module, state_dict, strict=strict)


def consolidated_state_dict(
    engine: Any, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The whole model's state dict from a training engine, at any ZeRO stage.

    Under stage 3 the parameters are gathered one at a time, so every rank must call this;
    below stage 3 every rank holds whole weights and the module's own state dict is returned.
    """
    gather = getattr(engine.strategy, "consolidated_state_dict", None)
    if gather is not None:
        out: dict[str, torch.Tensor] = gather(dtype)
        return out
    copies: dict[tuple[Any, ...], torch.Tensor] = {}
    sd = {}
    for k, v in engine.module.state_dict().items():
        # A tied weight stays one tensor under each of its names (save_pretrained writes it once).
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), v.shape, v.stride(), v.dtype)
        if key not in copies:
            t = v.detach().clone()
            copies[key] = t.to(dtype) if dtype is not None and t.is_floating_point() else t
        sd[k] = copies[key]
    return sd
