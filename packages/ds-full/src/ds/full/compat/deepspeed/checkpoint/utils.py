"""``deepspeed.checkpoint.utils``: the file names of a DeepSpeed checkpoint tag and
``clone_tensors_for_torch_save``."""

from __future__ import annotations

import os
from typing import Any

import torch


def get_model_ckpt_name_for_rank(base_folder: str, mp_rank_str: str) -> str:
    """``<base>/mp_rank_<mp_rank_str>_model_states.pt``."""
    return os.path.join(base_folder, f"mp_rank_{mp_rank_str}_model_states.pt")


def get_zero_ckpt_name_for_rank(base_folder: str, dp_rank: int, mp_rank: int) -> str:
    """``<base>/zero_pp_rank_<dp>_mp_rank_<mp:02d>_optim_states.pt``."""
    return os.path.join(
        base_folder, f"zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}_optim_states.pt"
    )


def get_layer_ckpt_name_for_rank(base_folder: str, layer_id: str, tp_rank: int) -> str:
    """``<base>/<layer_id>-model_<tp:02d>_model_states.pt`` (a pipeline layer's file)."""
    return os.path.join(base_folder, f"{layer_id}-model_{tp_rank:02d}_model_states.pt")


def clone_tensors_for_torch_save(item: Any, device: Any = "cpu") -> Any:
    """Copies of the tensors in ``item`` (nested lists, tuples, dicts) on ``device``, so that
    ``torch.save`` writes each tensor's own elements rather than a whole shared flat buffer."""
    if torch.is_tensor(item):
        if type(device) is str:
            device = torch.device(device)
        if device == item.device:
            return item.detach().clone()
        return item.detach().to(device)
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(v, device) for v in item]
    if isinstance(item, tuple):
        return tuple(clone_tensors_for_torch_save(v, device) for v in item)
    if isinstance(item, dict):
        return type(item)({k: clone_tensors_for_torch_save(v, device) for k, v in item.items()})
    return item


__all__ = [
    "clone_tensors_for_torch_save",
    "get_layer_ckpt_name_for_rank",
    "get_model_ckpt_name_for_rank",
    "get_zero_ckpt_name_for_rank",
]
