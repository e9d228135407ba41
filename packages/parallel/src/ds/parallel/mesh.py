"""The device mesh: pipeline x data x sequence x tensor parallel process groups built once per job.

Rank layout is the contract's (:mod:`ds.interfaces.parallel`): tensor-parallel ranks adjacent,
then sequence, then data, then pipeline stages outermost. Groups are created through the given Communicator (so a simulated world
works as well as torch's), every rank creating every group in the same order as torch requires,
and each rank keeps the handles of the groups that hold it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ds.interfaces.errors import ConfigError
from ds.interfaces.parallel import DIMS, MeshShape


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{name} must be a positive integer, got {value!r}; set it to 1 to disable"
        )
    return value


def mesh_shape_from_config(world_size: int, tp: int = 1, sp: int = 1, pp: int = 1) -> MeshShape:
    """The mesh for ``world_size`` ranks with ``pp`` pipeline stages and ``tp`` tensor- and ``sp``
    sequence-parallel ranks per stage; the data-parallel size is what remains. Raises a one-line
    ConfigError when they do not divide."""
    world_size = _positive("world size", world_size)
    tp = _positive("tensor_parallel.autotp_size", tp)
    sp = _positive("sequence_parallel_size", sp)
    pp = _positive("pipeline.stages", pp)
    if world_size % pp:
        raise ConfigError(
            f"pipeline num_stages={pp} does not divide the world size {world_size}; choose a "
            f"divisor of {world_size} or launch a multiple of {pp} ranks"
        )
    if pp > 1:
        inner = mesh_shape_from_config(world_size // pp, tp, sp)
        return MeshShape(dp=inner.dp, sp=inner.sp, tp=inner.tp, pp=pp)
    if world_size % tp:
        raise ConfigError(
            f"tensor_parallel.autotp_size={tp} does not divide the world size {world_size}; "
            f"choose a divisor of {world_size}"
        )
    if (world_size // tp) % sp:
        raise ConfigError(
            f"sequence_parallel_size={sp} does not divide world size {world_size} / "
            f"autotp_size {tp} = {world_size // tp}; choose a divisor of {world_size // tp}"
        )
    return MeshShape(dp=world_size // (tp * sp), sp=sp, tp=tp)


def group_ranks(shape: MeshShape, dim: str) -> list[tuple[int, ...]]:
    """Every group of ``dim`` as global ranks in group-rank order, in creation order."""
    return shape.groups(dim)


@dataclass(eq=False, repr=False)
class Mesh:
    """One rank's view of the mesh (implements :class:`ds.interfaces.parallel.ParallelMesh`):
    this rank's group and group ranks in each dimension."""

    shape: MeshShape
    rank: int
    _groups: dict[str, Any]
    _ranks: dict[str, tuple[int, ...]]
    _comm: Any = None

    def _check(self, dim: str) -> None:
        if dim not in self._groups:
            raise ConfigError(f"unknown mesh dimension {dim!r}; use one of {', '.join(DIMS)}")

    def group(self, dim: str) -> Any:
        self._check(dim)
        return self._groups[dim]

    def ranks(self, dim: str) -> tuple[int, ...]:
        self._check(dim)
        return self._ranks[dim]

    def index(self, dim: str) -> int:
        return self.ranks(dim).index(self.rank)

    def size(self, dim: str) -> int:
        return len(self.ranks(dim))

    def describe(self) -> dict[str, Any]:
        """Sizes, this rank's index in each dimension and each of its groups' global ranks."""
        # The pipeline dimension is listed only when there are stages (pp > 1).
        dims = DIMS if self.shape.pp > 1 else tuple(d for d in DIMS if d != "pp")
        sizes = {"dp": self.shape.dp, "sp": self.shape.sp, "tp": self.shape.tp}
        if self.shape.pp > 1:
            sizes["pp"] = self.shape.pp
        return {
            "world_size": self.shape.world_size,
            "rank": self.rank,
            "sizes": sizes,
            "index": {dim: self.index(dim) for dim in dims},
            "groups": {dim: list(self._ranks[dim]) for dim in dims},
        }

    def full_state_dict(self, module: Any) -> dict[str, Any]:
        """``module``'s state dict with tensor-parallel slices reassembled (on the host).
        Collective over the TP group."""
        from ds.parallel.tp.state import gather_full_state_dict

        return gather_full_state_dict(module, self._comm, self)

    def __repr__(self) -> str:
        s = self.shape
        pp = f"pp={s.pp}, " if s.pp > 1 else ""
        return f"Mesh({pp}dp={s.dp}, sp={s.sp}, tp={s.tp}, rank={self.rank})"


def build_mesh(comm: Any, shape: MeshShape) -> Mesh:
    """Create the dp, sp, tp, dp_sp and pp groups on ``comm`` (collective: every rank must call
    it). Without pipeline stages (pp = 1) the pp group is this rank alone and no group is made."""
    world = int(comm.get_world_size())
    if shape.world_size != world:
        pp = f"pp={shape.pp} x " if shape.pp > 1 else ""
        raise ConfigError(
            f"mesh {pp}dp={shape.dp} x sp={shape.sp} x tp={shape.tp} = {shape.world_size} ranks, "
            f"but the world has {world}; choose sizes whose product is {world} "
            f"(e.g. mesh_shape_from_config({world}, tp, sp))"
        )
    rank = int(comm.get_rank())
    groups: dict[str, Any] = {}
    mine: dict[str, tuple[int, ...]] = {}
    for dim in DIMS:
        if dim == "pp" and shape.pp == 1:
            # No stages: the same groups as before the pipeline dimension existed.
            groups[dim], mine[dim] = None, (rank,)
            continue
        for ranks in group_ranks(shape, dim):
            # torch requires every rank to create every group, in the same order.
            handle = comm.new_group(list(ranks))
            if rank in ranks:
                groups[dim] = handle
                mine[dim] = ranks
    return Mesh(shape, rank, groups, mine, comm)


__all__ = ["Mesh", "build_mesh", "group_ranks", "mesh_shape_from_config"]
