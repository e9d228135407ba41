"""The engine's parameter groups: the user's groups, split so each strategy group holds one kind
of parameter.

A user group splits by tensor parallelism (replicated parameters, then the tensor-parallel slices,
marked ``ds_tp``), by pipeline tied copies an earlier stage counts (``ds_pp_replica``) and by
expert replica group (``ds_replica``, :mod:`ds.interfaces.moe`). ``ds_origin`` names the user
group each engine group came from (checkpoints regroup by it at another split).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ds.interfaces.errors import ConfigError
from ds.interfaces.moe import replica_group
from ds.interfaces.parallel import ParallelMesh, pp_replica, tp_dim


def engine_param_groups(
    model: torch.nn.Module,
    model_parameters: Iterable[Any] | None,
    mesh: ParallelMesh | None,
    stage: int,
) -> tuple[list[dict[str, Any]], list[int]]:
    """The split groups (without ``ds_origin``) and, per group, the user group it came from."""
    split = _split_replicas(_split_tp(user_param_groups(model, model_parameters), mesh))
    if stage == 3 and any("ds_replica" in g for g in split):
        raise ConfigError(
            "zero_optimization.stage=3 with mixture-of-experts (expert parameters) is not "
            "available in ds; use stage 0, 1 or 2"
        )
    origin = [int(g.pop("ds_origin")) for g in split]
    return split, origin


def user_param_groups(
    model: torch.nn.Module, model_parameters: Iterable[Any] | None
) -> list[dict[str, Any]]:
    """``model_parameters`` as torch-style groups (all trainable parameters when None)."""
    if model_parameters is None:
        return [{"params": [p for p in model.parameters() if p.requires_grad]}]
    items = list(model_parameters)
    if items and isinstance(items[0], dict):
        return [dict(g, params=list(g["params"])) for g in items]
    if items and isinstance(items[0], tuple):  # named_parameters()
        return [{"params": [p for _, p in items]}]
    return [{"params": items}]


def regroup(objects: dict[str, Any], origin: list[int]) -> None:
    """Per-group optimizer objects of a checkpoint saved with other engine groups (another TP
    size splits the user's groups differently): each group takes its user group's entry."""
    for key in ("optimizer.scalar_state", "optimizer.param_groups"):
        saved = objects.get(key)
        if not saved:
            continue
        saved_origin = objects.get("optimizer.group_origin") or list(range(len(saved)))
        first = {o: i for i, o in reversed(list(enumerate(saved_origin)))}
        objects[key] = [saved[first[o]] for o in origin if o in first]


def _split_tp(groups: list[dict[str, Any]], mesh: ParallelMesh | None) -> list[dict[str, Any]]:
    """With tensor parallelism, each group splits in two: replicated parameters, then the
    tensor-parallel slices (marked ``ds_tp``), so the global gradient norm can count each slice
    once and each replicated parameter once (see ZeroStrategy.prepare_step). With pipeline
    stages, tied copies an earlier stage counts (``ds_pp_replica``) get a group of their own."""
    tp = mesh is not None and mesh.shape.tp > 1
    pp = mesh is not None and mesh.shape.pp > 1
    if not (tp or pp):
        return [dict(g, ds_origin=i) for i, g in enumerate(groups)]
    out: list[dict[str, Any]] = []
    for i, g in enumerate(groups):
        for sliced in (False, True):
            for replica in (False, True):
                params = [
                    p
                    for p in g["params"]
                    if (tp_dim(p) is not None) == sliced and (pp and pp_replica(p)) == replica
                ]
                if not params:
                    continue
                extra: dict[str, Any] = {}
                if sliced:
                    extra["ds_tp"] = True
                if replica:
                    extra["ds_pp_replica"] = True
                out.append(dict(g, params=params, ds_origin=i, **extra))
    return out


def _split_replicas(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Expert parameters (held by a replica group, :mod:`ds.interfaces.moe`) leave their group
    for one of their own per replica group, marked ``ds_replica``: it is partitioned and reduced
    over those ranks. Groups DeepSpeed's split_params_into_different_moe_groups_for_optimizer
    already made pass through whole."""
    out: list[dict[str, Any]] = []
    for g in groups:
        rest = [p for p in g["params"] if replica_group(p) is None]
        by_group: dict[str, list[Any]] = {}
        for p in g["params"]:
            rg = replica_group(p)
            if rg is not None:
                by_group.setdefault(rg.name, []).append(p)
        if rest or not by_group:
            out.append(dict(g, params=rest))
        for params in by_group.values():
            out.append(dict(g, params=params, ds_replica=replica_group(params[0])))
    return out
