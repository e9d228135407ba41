"""Expert-parallel and expert-data-parallel groups, carved out of the data-parallel ranks as
DeepSpeed carves them.

For ``W`` data-parallel ranks and ``ep_size`` E: the expert-parallel groups are ``W / E`` runs of
``E`` adjacent ranks (``[0..E)``, ``[E..2E)``, ...), which together hold every expert once; the
expert-data-parallel groups are the ranks at the same position of each run (``{j, j+E, j+2E,
...}``), which hold the same experts and average their gradients. The groups are named
``ep_size_<E>`` (DeepSpeed's ``group_name`` of the expert parameters) and created once per size
through the Communicator, every rank creating every group in the same order.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from ds.interfaces.errors import ConfigError
from ds.interfaces.moe import ReplicaGroup


@dataclass(frozen=True, eq=False)
class ExpertGroups:
    ep_size: int
    ep_group: Any  # this rank's expert-parallel group (None when ep_size is 1)
    ep_ranks: tuple[int, ...]
    ep_rank: int  # this rank's position in it: it holds experts [ep_rank * n, (ep_rank+1) * n)
    replicas: ReplicaGroup  # this rank's expert-data-parallel group

    @property
    def name(self) -> str:
        return self.replicas.name


def expert_layout(world: int, ep_size: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """``(expert-parallel groups, expert-data-parallel groups)`` of ``world`` data-parallel ranks."""
    if ep_size < 1 or world % ep_size:
        raise ConfigError(
            f"ep_size={ep_size} does not divide the data-parallel size {world}; choose a "
            f"divisor of {world} (expert_parallel.autoep_size / MoE(ep_size=...))"
        )
    ep = [tuple(range(i, i + ep_size)) for i in range(0, world, ep_size)]
    edp = [tuple(range(j, world, ep_size)) for j in range(ep_size)]
    return ep, edp


# (id(comm), ep_size) -> (a weak reference to that comm, its groups). An id is reused once its
# object is gone, so a hit counts only when the reference still points at the same comm: a
# later communicator (a new world) at a recycled address must not get the old world's groups.
_cache: dict[tuple[int, int], tuple[Any, ExpertGroups]] = {}


def expert_groups(comm: Any, ep_size: int) -> ExpertGroups:
    """This rank's groups for ``ep_size`` (created on first use; collective then)."""
    distributed = comm is not None and comm.is_initialized()
    world = int(comm.get_world_size()) if distributed else 1
    key = (id(comm) if distributed else 0, ep_size)
    found = _cache.get(key)
    if found is not None and found[0]() is (comm if distributed else None):
        return found[1]
    ep_layout, edp_layout = expert_layout(world, ep_size)
    rank = int(comm.get_rank()) if distributed else 0
    name = f"ep_size_{ep_size}"
    if not distributed:
        groups = ExpertGroups(ep_size, None, (0,), 0, ReplicaGroup(name, None, (0,)))
        _cache[key] = (_no_comm, groups)
        return groups
    mine: dict[str, Any] = {}
    for kind, layout in (("ep", ep_layout), ("edp", edp_layout)):
        for ranks in layout:
            handle = comm.new_group(list(ranks))  # every rank creates every group, in order
            if rank in ranks:
                mine[kind] = (handle, ranks)
    ep_handle, ep_ranks = mine["ep"]
    edp_handle, edp_ranks = mine["edp"]
    groups = ExpertGroups(
        ep_size,
        ep_handle if ep_size > 1 else None,
        ep_ranks,
        ep_ranks.index(rank),
        ReplicaGroup(name, edp_handle, edp_ranks),
    )
    _cache[key] = (weakref.ref(comm), groups)
    return groups


def _no_comm() -> None:
    return None


def created(group_name: str) -> ExpertGroups | None:
    """This process's groups named ``group_name`` (``ep_size_<E>``) if a layer created them."""
    for ref, groups in _cache.values():
        if groups.name == group_name and (ref is _no_comm or ref() is not None):
            return groups
    return None


__all__ = ["ExpertGroups", "created", "expert_groups", "expert_layout"]
