"""Expert-parallel (AutoEP) parameters in a universal checkpoint: each expert weight is stored
whole, all experts stacked along dim 0, with ``is_expert_param`` and ``ep_num_experts``, so that it
can be re-cut for another expert-parallel degree.

Under ZeRO-1/2 an expert parameter ``[local_experts, ...]`` lives on every rank of its
expert-parallel position, partitioned over that position's expert-data-parallel ranks. Which
data-parallel ranks those are depends on the group ordering: expert-major (``ep_rank``,
``ep_rank + ep_size``, ...) by default, or consecutive when data parallelism comes first.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ds.checkpoint.universal_convert import STATES
from ds.checkpoint.universal_tp import CAT_DIM, PARAM

IS_EXPERT = "is_expert_param"
NUM_EXPERTS = "ep_num_experts"
LAYERS_KEY = "ds_autoep_layers"
PREFIX = "expert_key_prefix"
DATA_BEFORE_EXPERT = "use_data_before_expert_parallelism"


def fragment_path(temp: str, name: str, state: str, dp_rank: int) -> str:
    """Where the conversion's first pass put one data-parallel rank's fragment (tensor rank 0)."""
    return os.path.join(temp, name, "0", f"{state}.{dp_rank:02d}")


def expert_dp_ranks(ep_rank: int, dp_degree: int, ep_size: int, data_first: bool) -> range:
    """The data-parallel ranks holding the partitions of one expert-parallel position."""
    if dp_degree % ep_size:
        raise RuntimeError(f"ZeRO DP degree {dp_degree} is not divisible by AutoEP size {ep_size}.")
    if data_first:
        per = dp_degree // ep_size
        return range(ep_rank * per, (ep_rank + 1) * per)
    return range(ep_rank, dp_degree, ep_size)


def _load_fragment(path: str, state: str) -> torch.Tensor:
    t = torch.load(path, map_location="cpu", weights_only=False)
    if not torch.is_tensor(t):
        raise RuntimeError(f"AutoEP {state} fragment is not a tensor: {path}")
    if t.dtype != torch.float32:
        raise RuntimeError(f"AutoEP {state} fragment must be FP32, got {t.dtype} in {path}.")
    return t.flatten()


def consolidate_zero12_expert_states(
    temp: str,
    out: str,
    expert_info: Mapping[str, Mapping[str, Any]],
    local_shapes: Mapping[str, Sequence[int]],
    dp_degree: int,
    tp_degree: int,
    data_first: bool,
) -> None:
    """Writes ``zero/<name>/{fp32,exp_avg,exp_avg_sq,step}.pt`` of each expert parameter from
    the first pass's ZeRO-1/2 fragments."""
    if tp_degree != 1:
        raise NotImplementedError(
            "ZeRO-1/2 universal checkpoint conversion of AutoEP experts with tensor parallelism "
            "is not supported."
        )
    for name, meta in expert_info.items():
        if name not in local_shapes:
            raise RuntimeError(
                f"AutoEP expert parameter {name} is missing from checkpoint parameter shapes."
            )
        if meta.get("expert_placement") is not None:
            raise NotImplementedError(
                f"{name}: AutoEP checkpoints with an explicit expert placement are not converted by ds"
            )
        ep_size, num_experts = int(meta["ep_size"]), int(meta["num_experts"])
        shape = tuple(local_shapes[name])
        if not shape or shape[0] != meta["num_local_experts"]:
            raise RuntimeError(
                f"AutoEP local shape mismatch for {name}: shape={shape}, "
                f"num_local_experts={meta['num_local_experts']}."
            )
        folder = os.path.join(out, "zero", name)
        os.makedirs(folder, exist_ok=True)
        for state in STATES:
            per_rank = []
            for ep_rank in range(ep_size):
                frags = [
                    _load_fragment(p, state)
                    for dp in expert_dp_ranks(ep_rank, dp_degree, ep_size, data_first)
                    if os.path.isfile(p := fragment_path(temp, name, state, dp))
                ]
                local = torch.cat(frags) if frags else torch.empty(0)
                if local.numel() != torch.Size(shape).numel():
                    raise RuntimeError(
                        f"AutoEP {state} fragment size mismatch for {name}, EP rank {ep_rank}: got "
                        f"{local.numel()}, expected {torch.Size(shape).numel()}."
                    )
                per_rank.append(local.reshape(shape))
            full = torch.cat(per_rank, dim=0)
            if full.shape[0] != num_experts:
                raise RuntimeError(
                    f"AutoEP consolidated expert count mismatch for {name}: got {full.shape[0]}, "
                    f"expected {num_experts}."
                )
            entry = {PARAM: full, CAT_DIM: 0, IS_EXPERT: True, NUM_EXPERTS: num_experts}
            torch.save(entry, os.path.join(folder, f"{state}.pt"))
        steps = [
            torch.load(p, map_location="cpu", weights_only=False)
            for dp in range(dp_degree)
            if os.path.isfile(p := fragment_path(temp, name, "step", dp))
        ]
        if not steps:
            raise RuntimeError(f"Missing AutoEP optimizer step for {name}.")
        if any(not _same(steps[0], s) for s in steps[1:]):
            raise RuntimeError(f"Inconsistent AutoEP optimizer steps for {name}.")
        torch.save(steps[0], os.path.join(folder, "step.pt"))


def _same(a: Any, b: Any) -> bool:
    if torch.is_tensor(a) and torch.is_tensor(b):
        return bool(torch.equal(a, b))
    return bool(a == b)


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def expert_param_info(layers: Any) -> dict[str, dict[str, Any]]:
    """``<prefix>.w1/w2/w3`` of every AutoEP layer record, with its expert counts (checked:
    ``num_experts == num_local_experts * ep_size``)."""
    if not isinstance(layers, list) or not layers:
        raise RuntimeError(
            "AutoEP metadata must be a non-empty list for ZeRO-1/2 universal conversion."
        )
    out: dict[str, dict[str, Any]] = {}
    for layer in layers:
        if not isinstance(layer, Mapping):
            raise RuntimeError("AutoEP layer metadata must contain dictionaries.")
        missing = [
            k for k in (PREFIX, "num_experts", "num_local_experts", "ep_size") if k not in layer
        ]
        if missing:
            raise RuntimeError(f"AutoEP layer metadata is missing fields: {missing}")
        prefix = layer[PREFIX]
        counts = [layer[k] for k in ("num_experts", "num_local_experts", "ep_size")]
        if not all(_positive(c) for c in counts) or counts[0] != counts[1] * counts[2]:
            raise RuntimeError(
                f"AutoEP expert count mismatch for {prefix}: num_experts={counts[0]}, "
                f"num_local_experts={counts[1]}, ep_size={counts[2]}."
            )
        for w in ("w1", "w2", "w3"):
            if f"{prefix}.{w}" in out:
                raise RuntimeError(f"Duplicate AutoEP expert parameter metadata for {prefix}.{w}.")
            out[f"{prefix}.{w}"] = dict(
                zip(("num_experts", "num_local_experts", "ep_size"), counts)
            )
    return out


def aggregate_zero12_metadata(
    metadata: Sequence[tuple[str, Mapping[str, Any]]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, bool]:
    """From each model-state file's metadata: its parameter shapes, the AutoEP layer records
    (one per expert prefix, which must agree across files) and the group ordering flag (which
    must agree too)."""
    shapes: list[dict[str, Any]] = []
    layers: dict[str, dict[str, Any]] = {}
    source: dict[str, str] = {}
    flags: dict[str, bool] = {}
    for f, meta in metadata:
        if not isinstance(meta["param_shapes"], dict):
            raise RuntimeError(
                f"DeepSpeed checkpoint param_shapes must contain dictionaries in {f}."
            )
        shapes.append(meta["param_shapes"])
        autoep = meta[LAYERS_KEY]
        if autoep is not None:
            if not isinstance(autoep, list):
                raise RuntimeError(f"AutoEP metadata must be a list in {f}.")
            for layer in autoep:
                if not isinstance(layer, dict):
                    raise RuntimeError(f"AutoEP layer metadata must contain dictionaries in {f}.")
                prefix = layer.get(PREFIX)
                if not isinstance(prefix, str) or not prefix:
                    raise RuntimeError(
                        f"AutoEP expert_key_prefix must be a non-empty string in {f}."
                    )
                if prefix in layers and layers[prefix] != layer:
                    raise RuntimeError(
                        f"Conflicting AutoEP metadata for expert_key_prefix {prefix!r} in "
                        f"{source[prefix]} and {f}."
                    )
                layers.setdefault(prefix, layer)
                source.setdefault(prefix, f)
        cfg = meta["ds_config"]
        if not isinstance(cfg, dict):
            raise RuntimeError(f"DeepSpeed checkpoint ds_config must be a dictionary in {f}.")
        flag = cfg.get(DATA_BEFORE_EXPERT, False)
        if not isinstance(flag, bool):
            raise RuntimeError(
                f"DeepSpeed checkpoint {DATA_BEFORE_EXPERT} must be a boolean in {f}."
            )
        flags[f] = flag
    if len(set(flags.values())) != 1:
        raise RuntimeError(
            f"DeepSpeed checkpoint {DATA_BEFORE_EXPERT} disagrees across model-state files: {flags}"
        )
    return shapes, list(layers.values()) or None, next(iter(flags.values()))


__all__ = [
    "aggregate_zero12_metadata",
    "expert_param_info",
    "consolidate_zero12_expert_states",
    "expert_dp_ranks",
    "fragment_path",
]
