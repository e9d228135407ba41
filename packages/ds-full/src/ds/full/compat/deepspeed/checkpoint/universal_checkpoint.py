"""``deepspeed.checkpoint.universal_checkpoint``: loading a universal checkpoint into the
parameters of a ZeRO-1/2 optimizer at any tensor- or expert-parallel degree. The slicing is
:mod:`ds.checkpoint.universal_slice`'s; here it is applied to a parameter's optimizer fragment
(``param._hp_mapping``: the element range ``lp_fragment_address`` of the rank's slice it owns)."""

from __future__ import annotations

import os
import re
import types
from collections.abc import Iterable
from typing import Any

import torch

from ds.checkpoint.universal_slice import autotp_rank_slice, layout_rank_slice, load_entry
from ds.checkpoint.universal_slice import narrow_sub_params as _narrow_sub_params  # noqa: F401
from ds.checkpoint.universal_tp import PARAM, VOCAB_TENSOR, SubparamShape
from ds.full.compat.deepspeed._missing import FeatureNotAvailableError
from ds.interfaces.tp_layout import UC_META_ATTR as DS_AUTOTP_UC_META

DS_AUTOEP_UC_META = "ds_autoep_uc_meta"
EP_IS_EXPERT_PARAM = "is_expert_param"
EP_NUM_EXPERTS = "ep_num_experts"


def _get_param_uc_restore_meta(param: Any) -> Any:
    """The restore view of a parameter's AutoTP record (its conversion view is nested under
    ``conversion``)."""
    return getattr(param, DS_AUTOTP_UC_META, None)


def _resolve_autotp_partition(
    current_param: Any,
    ckpt_dict: Any,
    full_hp_param: torch.Tensor,
    tp_rank: int,
    tp_world_size: int,
    state_key: str = "fp32",
) -> torch.Tensor | None:
    return autotp_rank_slice(
        _get_param_uc_restore_meta(current_param), full_hp_param, tp_rank, tp_world_size
    )


def _expert_slice(
    param: Any, entry: Any, full: torch.Tensor, ep_rank: int, ep_size: int
) -> torch.Tensor:
    if getattr(param, DS_AUTOEP_UC_META, None) is not None:
        raise FeatureNotAvailableError(
            "restoring AutoEP experts by their placement record is not available in ds; load the "
            "universal checkpoint at an even expert placement"
        )
    experts = entry.get(EP_NUM_EXPERTS)
    if experts is None or full.shape[0] != experts or experts % ep_size:
        raise AssertionError(
            f"expert parameter of {tuple(full.shape)} with {experts} experts does not split over "
            f"{ep_size} expert-parallel ranks"
        )
    local = experts // ep_size
    return full[ep_rank * local : (ep_rank + 1) * local]


def load_hp_checkpoint_state(
    self: Any, folder: str, tp_rank: int, tp_world_size: int, ep_rank: int = 0, ep_size: int = 1
) -> Any:
    """Fills this parameter's fp32 fragment (and its optimizer states' fragments in
    ``_hp_mapping.optim_fragment``) from ``folder`` (``zero/<param>/``); answers the saved step."""
    mapping = self._hp_mapping
    mapping.optim_fragment = {}
    step = None
    keys = [m.group(1) for f in os.listdir(folder) if (m := re.fullmatch(r"(.+)\.pt", f))]
    autotp = _get_param_uc_restore_meta(self) is not None
    for key in keys:
        entry = load_entry(os.path.join(folder, f"{key}.pt"))
        if key == "step":
            step = entry
            continue
        full = entry[PARAM]
        expert = entry.get(EP_IS_EXPERT_PARAM, False)
        if expert and (ep_size > 1 or getattr(self, DS_AUTOEP_UC_META, None) is not None):
            full = _expert_slice(self, entry, full, ep_rank, ep_size)
        rank, world = tp_rank, tp_world_size
        if full.shape == self.shape and not autotp:
            rank, world = 0, 1  # a whole (replicated or averaged) parameter
        if entry.get(VOCAB_TENSOR, False) and not expert and not autotp:
            # the converter strips the vocabulary padding; pad again for this degree
            padded = self.shape[0] * world
            if padded < full.shape[0]:
                raise AssertionError(
                    f"Vocab tensor padded size {padded} < loaded size {full.shape[0]}"
                )
            full = torch.nn.functional.pad(full, (0, 0, 0, padded - full.shape[0]))
        piece = autotp_rank_slice(_get_param_uc_restore_meta(self), full, rank, world)
        if piece is None:
            piece = layout_rank_slice(entry, full, self.numel(), rank, world)
        address = mapping.lp_fragment_address
        fragment = piece.narrow(0, address.start, address.numel)
        if key == "fp32":
            mapping.get_hp_fragment().data.copy_(fragment.data)
        else:
            mapping.optim_fragment[key] = fragment.clone().detach()
    return step


def enable_universal_checkpoint(param_list: Iterable[Any]) -> None:
    """Gives each parameter ``load_hp_checkpoint_state``."""
    for param in param_list:
        param.load_hp_checkpoint_state = types.MethodType(load_hp_checkpoint_state, param)


__all__ = [
    "SubparamShape",
    "enable_universal_checkpoint",
    "load_hp_checkpoint_state",
]
