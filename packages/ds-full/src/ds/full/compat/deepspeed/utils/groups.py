"""``deepspeed.utils.groups``: the groups of the mesh ``ds.initialize`` (or ``tp_model_init``) built
in this process; without one every rank is data parallel and the model-, expert- and
sequence-parallel worlds have size 1."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ds.full.compat.deepspeed import comm as dist
from ds.full.compat.deepspeed.utils.logging import log_dist


def current_mesh() -> Any:
    from ds.full.parallel import current_mesh as mesh

    return mesh()


def _world() -> int:
    from ds import comm

    return comm.get_world_size() if comm.is_initialized() else 1


def _rank() -> int:
    from ds import comm

    return comm.get_rank() if comm.is_initialized() else 0


def _getters(
    dim: str, world: Callable[[], int] = lambda: 1, rank: Callable[[], int] = lambda: 0
) -> tuple[Callable[[], int], Callable[[], int], Callable[[], Any]]:
    """DeepSpeed's world size, rank and group getters of mesh dimension ``dim``; without a mesh
    they answer ``world()``, ``rank()`` and None (the world group)."""

    def world_size() -> int:
        mesh = current_mesh()
        return len(mesh.ranks(dim)) if mesh is not None else world()

    def rank_in() -> int:
        mesh = current_mesh()
        return mesh.index(dim) if mesh is not None else rank()

    def group() -> Any:
        mesh = current_mesh()
        return mesh.group(dim) if mesh is not None else None

    return world_size, rank_in, group


_get_data_parallel_world_size, _get_data_parallel_rank, _get_data_parallel_group = _getters(
    "dp", _world, _rank
)
_get_sequence_parallel_world_size, _get_sequence_parallel_rank, _get_sequence_parallel_group = (
    _getters("sp")
)
_get_model_parallel_world_size, _get_model_parallel_rank, _get_model_parallel_group = _getters("tp")


def _get_sequence_data_parallel_group() -> Any:
    mesh = current_mesh()
    return mesh.group("dp_sp") if mesh is not None else None


_get_tensor_model_parallel_world_size = _get_model_parallel_world_size
_get_tensor_model_parallel_rank = _get_model_parallel_rank
_get_tensor_model_parallel_group = _get_model_parallel_group
get_tensor_model_parallel_world_size = _get_model_parallel_world_size
get_tensor_model_parallel_rank = _get_model_parallel_rank


def get_tensor_model_parallel_src_rank() -> int:
    """The global rank of the first rank of this rank's tensor-parallel group (the source of
    broadcasts that make the group's inputs agree)."""
    mesh = current_mesh()
    return mesh.ranks("tp")[0] if mesh is not None else _rank()


def _expert(group_name: str) -> Any:
    # The expert groups a MoE layer (or AutoEP) created in this process, by DeepSpeed's name.
    from ds.parallel.moe.groups import created

    return created(group_name)


def _get_expert_parallel_world_size(group_name: str = "") -> int:
    groups = _expert(group_name)
    return groups.ep_size if groups is not None else 1


def _get_expert_parallel_rank(group_name: str = "") -> int:
    groups = _expert(group_name)
    return groups.ep_rank if groups is not None else 0


def _get_expert_parallel_group(group_name: str = "") -> Any:
    groups = _expert(group_name)
    return groups.ep_group if groups is not None else None


def _get_expert_data_parallel_world_size(group_name: str = "") -> int:
    groups = _expert(group_name)
    return groups.replicas.size if groups is not None else _world()


def _get_expert_data_parallel_rank(group_name: str = "") -> int:
    groups = _expert(group_name)
    return groups.replicas.ranks.index(_rank()) if groups is not None else _rank()


def _get_expert_data_parallel_group(group_name: str = "") -> Any:
    groups = _expert(group_name)
    return groups.replicas.group if groups is not None else None


def _get_expert_parallel_ranks(
    world_size: int,
    tensor_parallel_size_: int,
    expert_parallel_size_: int,
    pipeline_parallel_size_: int = 1,
    use_data_before_expert_parallel_: bool = False,
) -> tuple[list[list[int]], list[list[int]]]:
    """``(expert-parallel groups, expert-data-parallel groups)`` of DeepSpeed's layout: tensor
    parallel ranks adjacent, pipeline stages in contiguous blocks; inside each data-parallel group
    the experts are split over consecutive chunks of ``expert_parallel_size_`` ranks (strided
    instead with ``use_data_before_expert_parallel_``)."""
    tp, ep, pp = tensor_parallel_size_, expert_parallel_size_, pipeline_parallel_size_
    if world_size % (tp * pp) or (world_size // (tp * pp)) % ep:
        raise ValueError(
            f"world {world_size} with tensor parallel {tp} and pipeline {pp}: the data-parallel "
            f"size must be a multiple of expert parallel size {ep}"
        )
    dp = world_size // (tp * pp)
    ep_groups: list[list[int]] = []
    edp_groups: list[list[int]] = []
    for stage in range(pp):
        base = stage * (world_size // pp)
        for t in range(tp):
            ranks = [base + t + i * tp for i in range(dp)]
            chunks = [ranks[i : i + ep] for i in range(0, dp, ep)]
            strided = [ranks[j::ep] for j in range(ep)]
            if use_data_before_expert_parallel_:
                chunks, strided = (
                    [ranks[j :: dp // ep] for j in range(dp // ep)],
                    [ranks[i : i + dp // ep] for i in range(0, dp, dp // ep)],
                )
            ep_groups += chunks
            edp_groups += strided
    return ep_groups, edp_groups


# Tensor- and data-parallel groups made by _init_tp_mesh_device (DeepSpeed's AutoTP training
# groups); the getters below answer them first, then the mesh ds.initialize built.
_TENSOR_MODEL_PARALLEL_GROUP: Any = None
_MODEL_PARALLEL_GROUP: Any = None
_DATA_PARALLEL_GROUP: Any = None
_DEVICE_MESH_SPLIT_UNSUPPORTED = (
    "No backend for the parent process group or its backend does not support splitting"
)


def _init_tp_groups_with_new_group(
    tensor_model_parallel_size: int = 1, data_parallel_size: int | None = None
) -> tuple[Any, Any]:
    """The groups of a ``(data_parallel, tensor_parallel)`` layout from explicit rank lists:
    data-parallel groups strided by the TP size, TP groups of consecutive ranks."""
    global _TENSOR_MODEL_PARALLEL_GROUP, _MODEL_PARALLEL_GROUP, _DATA_PARALLEL_GROUP
    world, tp = dist.get_world_size(), tensor_model_parallel_size
    if world % tp or (data_parallel_size is not None and data_parallel_size * tp != world):
        raise ValueError(
            f"tensor_model_parallel_size={tp} (data_parallel_size={data_parallel_size}) does not "
            f"tile the world of {world} ranks"
        )
    rank = dist.get_rank()
    dp_group = tp_group = None
    for lane in range(tp):
        ranks = list(range(lane, world, tp))
        made = dist.new_group(ranks)
        dp_group = made if rank in ranks else dp_group
    for first in range(0, world, tp):
        ranks = list(range(first, first + tp))
        made = dist.new_group(ranks)
        tp_group = made if rank in ranks else tp_group
    _DATA_PARALLEL_GROUP, _TENSOR_MODEL_PARALLEL_GROUP = dp_group, tp_group
    _MODEL_PARALLEL_GROUP = tp_group
    return dp_group, tp_group


def _init_tp_mesh_device(
    tensor_model_parallel_size: int = 1, data_parallel_size: int | None = None
) -> tuple[Any, Any]:
    """Make (once) this rank's data- and tensor-parallel groups: from a device mesh, or from
    explicit rank lists where a mesh cannot split the world's group (and under
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, whose checks the mesh's split groups do not support)."""
    global _TENSOR_MODEL_PARALLEL_GROUP, _MODEL_PARALLEL_GROUP, _DATA_PARALLEL_GROUP
    if _TENSOR_MODEL_PARALLEL_GROUP is not None:
        return _DATA_PARALLEL_GROUP, _TENSOR_MODEL_PARALLEL_GROUP
    tp = tensor_model_parallel_size
    dp = data_parallel_size or dist.get_world_size() // tp
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL":
        log_dist("TORCH_DISTRIBUTED_DEBUG=DETAIL: tensor-parallel groups from rank lists", [0])
        return _init_tp_groups_with_new_group(tp, dp)
    try:
        mesh = dist.initialize_mesh_device((dp, tp), ("data_parallel", "tensor_parallel"))
    except RuntimeError as e:
        if _DEVICE_MESH_SPLIT_UNSUPPORTED not in str(e):
            raise
        log_dist("the device mesh cannot split groups: tensor-parallel groups from rank lists", [0])
        return _init_tp_groups_with_new_group(tp, dp)
    _TENSOR_MODEL_PARALLEL_GROUP = mesh.get_group(mesh_dim="tensor_parallel")
    _DATA_PARALLEL_GROUP = mesh.get_group(mesh_dim="data_parallel")
    _MODEL_PARALLEL_GROUP = _TENSOR_MODEL_PARALLEL_GROUP
    return _DATA_PARALLEL_GROUP, _MODEL_PARALLEL_GROUP


def _made_or_mesh(made: Any, dim: str, what: str) -> Any:
    if made is not None:
        return made
    mesh = current_mesh()
    if mesh is None:
        raise AssertionError(f"the {what} group is not initialized")
    return mesh.group(dim)


def get_tensor_model_parallel_group() -> Any:
    return _made_or_mesh(_TENSOR_MODEL_PARALLEL_GROUP, "tp", "tensor model parallel")


def get_model_parallel_group() -> Any:
    return _made_or_mesh(_MODEL_PARALLEL_GROUP, "tp", "model parallel")


def get_data_parallel_group() -> Any:
    return _made_or_mesh(_DATA_PARALLEL_GROUP, "dp", "data parallel")
