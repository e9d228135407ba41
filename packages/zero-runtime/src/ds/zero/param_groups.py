"""The engine's parameter groups: the user's groups, split so each strategy group holds one kind
of parameter, with a :class:`GroupMeta` saying which.

A user group splits by tensor parallelism (replicated parameters, then the tensor-parallel
slices), by pipeline tied copies an earlier stage counts and by expert replica group
(:mod:`ds.interfaces.moe`). Each strategy group carries its :class:`GroupMeta` under
:data:`META_KEY`, attached here once; strategies read it with :func:`group_meta` and hand the
optimizer :func:`hyper_params` (the group without it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from ds.interfaces.errors import ConfigError
from ds.interfaces.moe import ReplicaGroup, replica_group
from ds.interfaces.parallel import ParallelMesh, pp_replica, tp_dim

#: The key of a strategy group's :class:`GroupMeta` (the one key ds adds to a torch group).
META_KEY = "ds_meta"


@dataclass(frozen=True)
class GroupMeta:
    """What the engine knows of the parameters of one strategy group."""

    origin: int = 0  # the user's parameter group they came from (checkpoints regroup by it)
    tp_sliced: bool = False  # tensor-parallel slices: the norm counts each slice once
    pp_replica: bool = False  # tied copies an earlier pipeline stage counts in the norm
    replica: ReplicaGroup | None = None  # experts: partitioned and reduced over these ranks


def group_meta(group: Mapping[str, Any]) -> GroupMeta:
    """The group's :class:`GroupMeta` (the defaults for a group the engine did not split)."""
    meta = group.get(META_KEY)
    return meta if isinstance(meta, GroupMeta) else GroupMeta()


def hyper_params(group: Mapping[str, Any]) -> dict[str, Any]:
    """The group's optimizer hyper-parameters: everything but its parameters and metadata."""
    return {k: v for k, v in group.items() if k not in ("params", META_KEY)}


def engine_param_groups(
    model: torch.nn.Module,
    model_parameters: Iterable[Any] | None,
    mesh: ParallelMesh | None,
    stage: int,
) -> tuple[list[dict[str, Any]], list[int]]:
    """The strategy's groups and, per group, the user group it came from."""
    groups = _split_replicas(_split_tp(user_param_groups(model, model_parameters), mesh))
    if stage == 3 and any(group_meta(g).replica is not None for g in groups):
        raise ConfigError(
            "zero_optimization.stage=3 with mixture-of-experts (expert parameters) is not "
            "available in ds; use stage 0, 1 or 2"
        )
    return groups, [group_meta(g).origin for g in groups]


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
    tensor-parallel slices, so the global gradient norm can count each slice once and each
    replicated parameter once (see ZeroStrategy.prepare_step). With pipeline stages, tied
    copies an earlier stage counts get a group of their own."""
    tp = mesh is not None and mesh.shape.tp > 1
    pp = mesh is not None and mesh.shape.pp > 1
    if not (tp or pp):
        return [dict(g, **{META_KEY: GroupMeta(origin=i)}) for i, g in enumerate(groups)]
    out: list[dict[str, Any]] = []
    for i, g in enumerate(groups):
        for sliced in (False, True):
            for replica in (False, True):
                params = [
                    p
                    for p in g["params"]
                    if (tp_dim(p) is not None) == sliced and (pp and pp_replica(p)) == replica
                ]
                if params:
                    meta = GroupMeta(origin=i, tp_sliced=sliced, pp_replica=replica)
                    out.append(dict(g, params=params, **{META_KEY: meta}))
    return out


def _split_replicas(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Expert parameters (held by a replica group, :mod:`ds.interfaces.moe`) leave their group
    for one of their own per replica group: it is partitioned and reduced over those ranks.
    Groups DeepSpeed's split_params_into_different_moe_groups_for_optimizer already made pass
    through whole."""
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
            meta = replace(group_meta(g), replica=replica_group(params[0]))
            out.append(dict(g, params=params, **{META_KEY: meta}))
    return out
