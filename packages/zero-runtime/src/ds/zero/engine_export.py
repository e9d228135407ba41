"""The whole model as one file of weights (``save_16bit_model``): gathered at stage 3, the
tensor-parallel slices joined, experts collected from every rank; ``torch.save`` or
safetensors."""

from __future__ import annotations

import os
from typing import Any

import torch

from ds.interfaces.errors import CheckpointError, ConfigError, ProviderNotFoundError
from ds.interfaces.logging import get_logger
from ds.interfaces.moe import EXPORT_ATTR, expert_slice, replica_group

log = get_logger(__name__)


def save_16bit_model(engine: Any, save_dir: str, save_filename: str = "pytorch_model.bin") -> bool:
    """The body of :meth:`ZeroEngine.save_16bit_model`."""
    if engine.config.stage == 3:
        if not engine.ds_config.zero_optimization.gather_16bit_weights_on_model_save:
            log.warning(
                "save_16bit_model skipped: set "
                "zero_optimization.stage3_gather_16bit_weights_on_model_save to true to "
                "gather the stage-3 weights, or save a checkpoint and consolidate it offline"
            )
            return False
        if engine.mesh is not None and engine.mesh.shape.tp > 1:
            raise ConfigError(
                "save_16bit_model at ZeRO stage 3 with tensor parallelism is not available "
                "yet; save at stage 0-2, or gather with ds.parallel.tp.gather_full_state_dict "
                "inside deepspeed.zero.GatheredParameters"
            )
        weights = engine.strategy.consolidated_state_dict()
    elif engine.mesh is not None and engine.mesh.shape.tp > 1:
        # The slices reassembled: one file of the whole model, as without TP.
        engine.strategy.synchronize_parameters()
        weights = with_every_replica(engine, engine.mesh.full_state_dict(engine.module))
    else:
        engine.strategy.synchronize_parameters()
        weights = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
        weights = with_every_replica(engine, weights)
    if engine.rank == 0 and (engine.mesh is None or engine.mesh.index("tp") == 0):
        os.makedirs(save_dir, exist_ok=True)
        path = os.path.join(save_dir, save_filename)
        if save_filename.endswith(".safetensors"):
            save_safetensors(weights, path)
        else:
            torch.save(weights, path)
    return True


def with_every_replica(engine: Any, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Parameters only some ranks hold (experts, :mod:`ds.interfaces.moe`) collected from
    every rank, so one file holds the whole model: rows of a stacked expert tensor
    (``ExpertSlice``) joined into it, in row order; then the module's export mapping
    (``EXPORT_ATTR``: AutoEP restacks transformers' fused expert tensors), if it has one."""
    named = [(n, p) for n, p in engine.module.named_parameters() if replica_group(p) is not None]
    # Folded onto tensor parallelism, experts are spread over the TP ranks too: ask everyone.
    folded = engine.mesh is not None and engine.mesh.shape.tp > 1
    group = None if folded else engine.group
    size = int(engine.comm.get_world_size()) if folded else engine.world_size
    if named and engine.comm is not None and size > 1:
        mine = {n: (p.detach().to("cpu", copy=True), expert_slice(p)) for n, p in named}
        every: list[Any] = [None] * size
        engine.comm.all_gather_object(every, mine, group=group)
        rows: dict[str, dict[int, torch.Tensor]] = {}
        total: dict[str, int] = {}  # rows of each logical tensor
        for part in every:
            for name, (t, sl) in part.items():
                if sl is None:
                    weights[name] = t
                else:  # replicas of the same rows land on the same entry
                    rows.setdefault(name, {})[sl.first] = t
                    total[name] = sl.full_shape[0]
        for name, parts in rows.items():
            weights[name] = _stacked(name, parts, total[name])
    mapping = getattr(engine.module, EXPORT_ATTR, None)
    return mapping(weights) if callable(mapping) else weights


def _stacked(name: str, parts: dict[int, torch.Tensor], total: int) -> torch.Tensor:
    """The logical tensor from its slices (first row -> rows), each row exactly once."""
    covered = 0
    for first in sorted(parts):
        if first != covered:
            break
        covered += int(parts[first].shape[0])
    if covered != total:
        raise CheckpointError(
            f"{name}: the ranks' expert slices start at rows {sorted(parts)} and do not tile "
            f"its {total} rows; each expert-parallel rank marks its rows with "
            "ds.interfaces.moe.ExpertSlice(full_shape, first)"
        )
    return torch.cat([parts[first] for first in sorted(parts)], dim=0)


def save_safetensors(weights: dict[str, torch.Tensor], path: str) -> None:
    try:
        from safetensors.torch import save_file
    except ImportError as exc:
        raise ProviderNotFoundError(
            f"{os.path.basename(path)} asks for safetensors, which is not installed; "
            "pip install safetensors, or save under a .bin name"
        ) from exc
    # safetensors stores no aliases: tied weights are written once per name, as separate copies.
    save_file({k: v.detach().contiguous().clone() for k, v in weights.items()}, path)
