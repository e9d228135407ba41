"""The device mesh: data x sequence x tensor parallel process groups built once per job.

Rank layout is the contract's (:mod:`ds.interfaces.parallel`): tensor-parallel ranks adjacent,
then sequence, then data. Groups are created through the given Communicator (so a simulated world
works as well as torch's), every rank creating every group in the same order as torch requires,
and each rank keeps the handles of the groups that hold it.
"""

from __future__ import annotations

from typing import Any

from ds.interfaces.errors import ConfigError
from ds.interfaces.parallel import DIMS, MeshShape


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{name} must be a positive integer, got {value!r}; set it to 1 to disable"
        )
    return value


def mesh_shape_from_config(world_size: int, tp: int = 1, sp: int = 1) -> MeshShape:
    """The mesh for ``world_size`` ranks with ``tp`` tensor- and ``sp`` sequence-parallel ranks;
    the data-parallel size is what remains. Raises a one-line ConfigError when they do not divide."""
    world_size = _positive("world size", world_size)
    tp = _positive("tensor_parallel.autotp_size", tp)
    sp = _positive("sequence_parallel_size", sp)
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


class Mesh:
    """One rank's view of the mesh (implements :class:`ds.interfaces.parallel.ParallelMesh`)."""

    def __init__(
        self,
        shape: MeshShape,
        rank: int,
        groups: dict[str, Any],
        ranks: dict[str, tuple[int, ...]],
        comm: Any = None,
    ) -> None:
        self.shape = shape
        self.rank = rank
        self._groups = groups
        self._ranks = ranks
        self._comm = comm

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
        return {
            "world_size": self.shape.world_size,
            "rank": self.rank,
            "sizes": {"dp": self.shape.dp, "sp": self.shape.sp, "tp": self.shape.tp},
            "index": {dim: self.index(dim) for dim in DIMS},
            "groups": {dim: list(self._ranks[dim]) for dim in DIMS},
        }

    def full_state_dict(self, module: Any) -> dict[str, Any]:
        """``module``'s state dict with tensor-parallel slices reassembled (on the host).
        Collective over the TP group."""
        from ds.parallel.tp.state import gather_full_state_dict

        return gather_full_state_dict(module, self._comm, self)

    def __repr__(self) -> str:
        s = self.shape
        return f"Mesh(dp={s.dp}, sp={s.sp}, tp={s.tp}, rank={self.rank})"


def build_mesh(comm: Any, shape: MeshShape) -> Mesh:
    """Create the dp, sp, tp and dp_sp groups on ``comm`` (collective: every rank must call it)."""
    world = int(comm.get_world_size())
    if shape.world_size != world:
        raise ConfigError(
            f"mesh dp={shape.dp} x sp={shape.sp} x tp={shape.tp} = {shape.world_size} ranks, "
            f"but the world has {world}; choose sizes whose product is {world} "
            f"(e.g. mesh_shape_from_config({world}, tp, sp))"
        )
    rank = int(comm.get_rank())
    groups: dict[str, Any] = {}
    mine: dict[str, tuple[int, ...]] = {}
    for dim in DIMS:
        for ranks in group_ranks(shape, dim):
            # torch requires every rank to create every group, in the same order.
            handle = comm.new_group(list(ranks))
            if rank in ranks:
                groups[dim] = handle
                mine[dim] = ranks
    return Mesh(shape, rank, groups, mine, comm)


__all__ = ["Mesh", "build_mesh", "group_ranks", "mesh_shape_from_config"]
