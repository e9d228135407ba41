"""What the training engine needs to know about a device mesh (pipeline x data x sequence x tensor
parallel).

The mesh itself is built by ds-parallel; the engine sees only this contract, so ds-zero-runtime
never imports ds-parallel and ``ds.full`` wires the two.

Rank layout: tensor-parallel ranks are adjacent (they exchange the most traffic), then sequence,
then data, then pipeline stages outermost (they exchange only activations):
``global_rank = ((pp_index * dp + dp_index) * sp + sp_index) * tp + tp_index``. With ``pp = 1``
(the default) this is ``(dp_index * sp + sp_index) * tp + tp_index``.

Which groups the engine uses:

* ``"dp"``: the ranks holding the same model shard and the same sequence shard. Batch sizes are
  counted over it (``train_batch_size = micro * accumulation * dp``).
* ``"dp_sp"``: ZeRO reduces gradients and partitions state over it. Sequence-parallel ranks see
  different tokens of the same samples with identical (replicated) weights, so their gradients
  are averaged with the data-parallel ones.
* ``"tp"``: a parameter marked with :data:`TP_DIM_ATTR` is one slice of a larger weight split
  over this group; the global gradient norm adds the slices once each and counts replicated
  parameters once.
* ``"pp"``: the ranks holding the same data, sequence and tensor coordinates at every pipeline
  stage, in stage order. Every other group lies inside one stage: ZeRO reduces within a stage, and
  the global gradient norm adds the stages' squares over this group, counting a parameter marked
  with :data:`PP_REPLICA_ATTR` (a tied weight's copy on a later stage) zero times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

#: Attribute set on a parameter that holds one tensor-parallel slice: the dimension it is split on.
TP_DIM_ATTR = "ds_tp_dim"

#: Attribute set on a sliced parameter whose split dimension packs several equal segments (GPT-2's
#: fused q,k,v: 3) that are each split over the group; a slice is then the concatenation of each
#: segment's piece. Absent means 1 (one plain contiguous slice).
TP_FUSED_ATTR = "ds_tp_fused"

#: Attribute set on a parameter that is a copy of a weight held (and counted) by an earlier
#: pipeline stage: a tied embedding on the stage of the LM head. Its gradient equals the
#: original's after the tied all-reduce, so norms skip it.
PP_REPLICA_ATTR = "ds_pp_replica"

DIMS = ("dp", "sp", "tp", "dp_sp", "pp")


@dataclass(frozen=True)
class MeshShape:
    """Sizes of the mesh's dimensions; ``pp * dp * sp * tp`` is the world size."""

    dp: int = 1
    sp: int = 1
    tp: int = 1
    pp: int = 1

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.sp * self.tp

    @property
    def stage_size(self) -> int:
        """Ranks per pipeline stage (``dp * sp * tp``)."""
        return self.dp * self.sp * self.tp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(dp_index, sp_index, tp_index)`` of a global rank (see :meth:`pp_index`)."""
        tp_index = rank % self.tp
        sp_index = (rank // self.tp) % self.sp
        dp_index = (rank // (self.tp * self.sp)) % self.dp
        return dp_index, sp_index, tp_index

    def pp_index(self, rank: int) -> int:
        """The pipeline stage of a global rank."""
        return rank // self.stage_size

    def rank_of(self, dp_index: int, sp_index: int, tp_index: int, pp_index: int = 0) -> int:
        return ((pp_index * self.dp + dp_index) * self.sp + sp_index) * self.tp + tp_index

    def groups(self, dim: str) -> list[tuple[int, ...]]:
        """Every group of ``dim`` as global ranks in group-rank order, in creation order."""
        if dim not in DIMS:
            from ds.interfaces.errors import ConfigError

            raise ConfigError(f"unknown mesh dimension {dim!r}; use one of {', '.join(DIMS)}")
        r, dp, sp, tp, pp = self.rank_of, range(self.dp), range(self.sp), range(self.tp), range(self.pp)
        if dim == "pp":
            return [tuple(r(d, s, t, q) for q in pp) for d in dp for s in sp for t in tp]
        # Every other group lies inside one pipeline stage.
        if dim == "tp":
            return [tuple(r(d, s, t, q) for t in tp) for q in pp for d in dp for s in sp]
        if dim == "sp":
            return [tuple(r(d, s, t, q) for s in sp) for q in pp for d in dp for t in tp]
        if dim == "dp":
            return [tuple(r(d, s, t, q) for d in dp) for q in pp for s in sp for t in tp]
        return [tuple(r(d, s, t, q) for d in dp for s in sp) for q in pp for t in tp]


@runtime_checkable
class ParallelMesh(Protocol):
    """One rank's view of the mesh: its groups (communicator handles) and their global ranks."""

    shape: MeshShape
    rank: int

    def group(self, dim: str) -> Any:
        """The process group of ``dim`` ("dp", "sp", "tp", "dp_sp" or "pp") that holds this rank."""
        ...

    def ranks(self, dim: str) -> tuple[int, ...]:
        """Global ranks of this rank's ``dim`` group, in group-rank order."""
        ...

    def index(self, dim: str) -> int:
        """This rank's position in its ``dim`` group."""
        ...

    def full_state_dict(self, module: Any) -> dict[str, Any]:
        """``module``'s state dict with every tensor-parallel slice reassembled to its full shape
        (host tensors, the unsplit model's names). Collective over the TP group."""
        ...


def tp_dim(param: Any) -> int | None:
    """The dimension a parameter is split on across the tensor-parallel group, or None."""
    value = getattr(param, TP_DIM_ATTR, None)
    return None if value is None else int(value)


def pp_replica(param: Any) -> bool:
    """True for a tied weight's copy that an earlier pipeline stage holds and counts."""
    return bool(getattr(param, PP_REPLICA_ATTR, False))


def tp_fused(param: Any) -> int:
    """How many equal segments a sliced parameter's split dimension packs (1 when not fused)."""
    return int(getattr(param, TP_FUSED_ATTR, 1) or 1)


def split_slice(t: Any, dim: int, size: int, index: int, fused: int = 1) -> Any:
    """Slice ``index`` of ``size`` of tensor ``t`` along ``dim``; with ``fused`` packed segments
    (GPT-2's q, k, v), each segment is split and the pieces concatenated."""
    if size == 1:
        return t
    import torch

    segments = t.chunk(fused, dim=dim) if fused > 1 else (t,)
    pieces = [seg.chunk(size, dim=dim)[index] for seg in segments]
    return torch.cat(pieces, dim=dim) if fused > 1 else pieces[0]


def join_slices(pieces: Any, dim: int, fused: int = 1) -> Any:
    """The whole tensor from every slice in TP-rank order (inverse of :func:`split_slice`)."""
    import torch

    if fused == 1:
        return torch.cat(list(pieces), dim=dim)
    segments = [p.chunk(fused, dim=dim) for p in pieces]
    return torch.cat([torch.cat([s[i] for s in segments], dim=dim) for i in range(fused)], dim=dim)


__all__ = [
    "DIMS",
    "PP_REPLICA_ATTR",
    "TP_DIM_ATTR",
    "TP_FUSED_ATTR",
    "MeshShape",
    "ParallelMesh",
    "join_slices",
    "pp_replica",
    "split_slice",
    "tp_dim",
    "tp_fused",
]
