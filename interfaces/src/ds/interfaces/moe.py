"""What the training engine needs to know about expert (mixture-of-experts) parameters.

An expert parameter is held by a subset of the data-parallel ranks only: expert parallelism
shards the experts over an expert-parallel group of ``ep_size`` ranks, so each expert is
replicated over the *expert-data-parallel* group (the ranks at the same position of every
expert-parallel group). The layer that shards them (ds-parallel's ``ds.parallel.moe``) marks each
such parameter with :data:`REPLICA_ATTR`, a :class:`ReplicaGroup`; the engine then

* broadcasts its initial value within that group (not over all data-parallel ranks),
* keeps it in an optimizer group of its own, partitioned (ZeRO 1-2) over that group,
* sums its gradient over that group and divides by the *whole* data-parallel size: the tokens an
  expert sees come from every rank of its expert-parallel group, each rank's loss being a mean
  over its own micro-batch, so this is the gradient of the global batch's mean loss,
* counts it once in the global gradient norm (each replica group adds its copy once).

ds-zero-runtime reads only this contract and never imports ds-parallel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Attribute set on a parameter that only the ranks of a :class:`ReplicaGroup` hold.
REPLICA_ATTR = "ds_replica_group"

#: Attribute set on a model whose exported weights take other names than its parameters (AutoEP
#: keeps one parameter per expert, transformers one fused tensor): a callable mapping the whole
#: model's state dict (every rank's experts collected) to the one to write.
EXPORT_ATTR = "ds_export_state_dict"

#: Attribute set on a model whose checkpoints describe its expert layout: a callable taking the
#: model and returning picklable objects to save with each checkpoint under their keys (AutoEP:
#: ``{"ds_autoep_layers": [...]}``, the entries universal-checkpoint conversion reads).
CHECKPOINT_OBJECTS_ATTR = "ds_checkpoint_objects"

#: Attribute set on an expert parameter that is this rank's slice of a tensor stacked over the
#: expert-parallel ranks: DeepSpeed's ``AutoEPMoELayer`` keeps its ``E / ep`` local experts as
#: one ``[E / ep, ...]`` tensor under the same name on every rank. An :class:`ExpertSlice`.
#: Checkpoints store the logical ``[E, ...]`` tensor, each rank writing and reading its own rows,
#: so they are whole and load at any expert-parallel size.
EXPERT_SLICE_ATTR = "ds_expert_slice"


@dataclass(frozen=True, eq=False)
class ReplicaGroup:
    """The ranks holding identical copies of a parameter (its expert-data-parallel group)."""

    name: str  # e.g. "ep_size_2", DeepSpeed's group_name of the expert parameters
    group: Any  # the communicator's handle of the group (None: one process)
    ranks: tuple[int, ...]  # global ranks, in group-rank order

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True)
class ExpertSlice:
    """Rows ``[first, first + rows)`` of a logical tensor of ``full_shape`` (dim 0: experts)."""

    full_shape: tuple[int, ...]
    first: int

    @property
    def row_numel(self) -> int:
        n = 1
        for d in self.full_shape[1:]:
            n *= int(d)
        return n

    @property
    def element_offset(self) -> int:
        """Where this rank's slice starts in the flattened logical tensor."""
        return self.first * self.row_numel


def expert_slice(param: Any) -> ExpertSlice | None:
    """The logical tensor ``param`` is a slice of, or None for a whole tensor."""
    value = getattr(param, EXPERT_SLICE_ATTR, None)
    return value if isinstance(value, ExpertSlice) else None


def replica_group(param: Any) -> ReplicaGroup | None:
    """The group holding ``param``'s copies when it is not replicated over every data-parallel
    rank, else None."""
    value = getattr(param, REPLICA_ATTR, None)
    return value if isinstance(value, ReplicaGroup) else None


__all__ = [
    "CHECKPOINT_OBJECTS_ATTR",
    "EXPERT_SLICE_ATTR",
    "EXPORT_ATTR",
    "ExpertSlice",
    "REPLICA_ATTR",
    "ReplicaGroup",
    "expert_slice",
    "replica_group",
]
