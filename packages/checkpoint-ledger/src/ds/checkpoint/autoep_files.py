"""AutoEP expert files in a DeepSpeed checkpoint tag: one
``layer_<L>_expert_<E>_mp_rank_<mp>_model_states.pt`` per (MoE layer, global expert), gathered
into whole ``[num_experts, ...]`` weights of a universal checkpoint; and the folding record a
checkpoint saved with experts folded over tensor-parallel ranks carries, which a resume checks
against its own layout.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Collection, Mapping
from typing import Any

import torch

from ds.checkpoint.deepspeed_layout import load_file
from ds.checkpoint.universal_autoep import IS_EXPERT, NUM_EXPERTS
from ds.checkpoint.universal_tp import CAT_DIM, PARAM

FOLDING_KEY = "folding"
FOLDING_VERSION = 1
_FOLDED = (
    "Universal checkpoint conversion for folded AutoEP+AutoTP expert shards is not supported; "
    "load this checkpoint with a matching folded runtime"
)


def make_folding_metadata(
    *,
    tp_size: int,
    tp_rank: int,
    ep_size: int,
    ep_rank: int,
    zero_partition_group: str,
    zero_partition_rank: int,
    zero_partition_count: int,
    family: str,
    param_families: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The record one rank's file carries of the folded layout it was saved at (experts are
    never themselves tensor-parallel: ``etp_size`` 1)."""
    out: dict[str, Any] = {
        "version": FOLDING_VERSION,
        "tp_size": tp_size,
        "tp_rank": tp_rank,
        "ep_size": ep_size,
        "ep_rank": ep_rank,
        "etp_size": 1,
        "etp_rank": 0,
        "zero_partition_group": zero_partition_group,
        "zero_partition_rank": zero_partition_rank,
        "zero_partition_count": zero_partition_count,
        "dispatch_strategy": "route_full_partition_dispatch",
        "shared_expert_placement": "tp_sharded",
        "family": family,
    }
    if param_families is not None:
        out["param_families"] = dict(param_families)
    return out


def validate_folding_metadata(
    metadata: Any, *, tp_size: int, ep_size: int, etp_size: int = 1, **expected: Any
) -> dict[str, Any]:
    """The file's folding record, after checking it against the resuming layout: the sizes
    always, and each of ``expected`` (``tp_rank``, ``zero_partition_count``, ``family``, ...)
    that is not None."""
    if not isinstance(metadata, Mapping) or FOLDING_KEY not in metadata:
        raise RuntimeError("Missing AutoEP+AutoTP folding metadata in folded checkpoint.")
    folding = metadata[FOLDING_KEY]
    if folding.get("version") != FOLDING_VERSION:
        raise RuntimeError(f"Unsupported folding metadata version: {folding.get('version')}")
    wanted = {"tp_size": tp_size, "ep_size": ep_size, "etp_size": etp_size}
    wanted.update({k: v for k, v in expected.items() if v is not None})
    for key, value in wanted.items():
        if folding.get(key) != value:
            raise RuntimeError(
                f"Folding metadata mismatch for {key}: saved={folding.get(key)} runtime={value}"
            )
    return dict(folding)


def expert_file(directory: str, layer_id: int, expert_id: int) -> str:
    """The one file of a (MoE layer, global expert)."""
    found = glob.glob(
        os.path.join(directory, f"layer_{layer_id}_expert_{expert_id}_mp_rank_*_model_states.pt")
    )
    if not found:
        raise FileNotFoundError(
            f"Expert checkpoint file not found: layer_{layer_id} expert_{expert_id} in {directory}"
        )
    if len(found) > 1:
        if any(FOLDING_KEY in load_file(f) for f in found):
            raise NotImplementedError(_FOLDED)
        raise NotImplementedError(
            f"Multiple expert checkpoint files found for layer_{layer_id} expert_{expert_id}: "
            f"{sorted(found)}; expert files of several model-parallel ranks are not converted"
        )
    return found[0]


def consolidate_expert_files(
    directory: str,
    out: str,
    layers: Any,
    only: Collection[str] | None = None,
    fp32_dir: str | None = None,
) -> None:
    """``zero/<prefix>.w{1,2,3}/fp32.pt`` of every AutoEP layer: the experts' weights stacked
    in global expert order (``only``: just these parameters; ``fp32_dir``: write there)."""
    if layers is None:
        raise RuntimeError(
            "AutoEP metadata is missing from checkpoint. Cannot consolidate expert files without "
            "ds_autoep_layers metadata."
        )
    if not isinstance(layers, list):
        raise RuntimeError(
            f"AutoEP metadata is malformed: expected list, got {type(layers).__name__}"
        )
    for layer in layers:
        if layer.get("expert_placement") is not None:
            raise NotImplementedError(
                "AutoEP checkpoints with an explicit expert placement are not converted by ds"
            )
        num, prefix = int(layer["num_experts"]), layer["expert_key_prefix"]
        for w in ("w1", "w2", "w3"):
            name = f"{prefix}.{w}"
            if only is not None and name not in only:
                continue
            tensors, folding = [], None
            for e in range(num):
                path = expert_file(directory, layer["moe_layer_id"], e)
                sd = load_file(path)
                folding = folding if folding is not None else sd.get(FOLDING_KEY)
                if f"{name}.{e}" not in sd:
                    raise RuntimeError(f"Expected key '{name}.{e}' not found in {path}")
                tensors.append(sd[f"{name}.{e}"])
            entry: dict[str, Any] = {
                PARAM: torch.stack(tensors),
                CAT_DIM: 0,
                IS_EXPERT: True,
                NUM_EXPERTS: num,
            }
            if folding is not None:
                entry[FOLDING_KEY] = folding
            folder = os.path.join(fp32_dir, name) if fp32_dir else os.path.join(out, "zero", name)
            os.makedirs(folder, exist_ok=True)
            torch.save(entry, os.path.join(folder, "fp32.pt"))


__all__ = [
    "consolidate_expert_files",
    "expert_file",
    "make_folding_metadata",
    "validate_folding_metadata",
]
