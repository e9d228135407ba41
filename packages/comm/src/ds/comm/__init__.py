"""ds.comm: torch.distributed-compatible collectives with logging, coalescing and a hang watchdog.

``from ds import comm as dist`` replaces ``import torch.distributed as dist``.
"""

import torch.distributed as _torch_dist

from ds.comm.api import (
    DEFAULT_TIMEOUT_S,
    all_gather,
    all_gather_coalesced,
    all_gather_into_tensor,
    all_gather_object,
    all_gather_single,
    all_reduce,
    all_to_all,
    all_to_all_quant_reduce,
    all_to_all_single,
    barrier,
    broadcast,
    broadcast_object_list,
    collective_timeout,
    configure,
    destroy_process_group,
    gather,
    gather_object,
    get_backend,
    get_comms_logger,
    get_communicator,
    get_global_rank,
    get_local_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    inference_all_reduce,
    init_distributed,
    init_process_group,
    irecv,
    is_available,
    is_initialized,
    isend,
    log_summary,
    new_group,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_coalesced,
    reduce_scatter_single,
    reduce_scatter_tensor,
    scatter,
    scatter_object_list,
    send,
    set_communicator,
)
from ds.comm.backends.torch_backend import TorchCommunicator
from ds.comm.comms_logger import CommsLogger
from ds.interfaces.comm import ReduceOp
from ds.interfaces.errors import CollectiveTimeoutError, CommError

# torch.distributed's group handles (dist.group.WORLD) for drop-in code.
group = _torch_dist.group
GroupMember = _torch_dist.GroupMember


def get_world_group() -> object:
    """The group of every rank (``group.WORLD``), as DeepSpeed's comm returns it."""
    return group.WORLD


def initialize_mesh_device(mesh_shape: tuple[int, ...], mesh_dim_names: tuple[str, ...]) -> object:
    """torch's ``DeviceMesh`` of every rank, shaped ``mesh_shape`` (its groups split from the
    world's), on the device type of the job's backend (gloo: cpu, otherwise cuda)."""
    from torch.distributed.device_mesh import init_device_mesh

    device = "cpu" if get_backend() in ("gloo", "mpi") else "cuda"
    return init_device_mesh(device, tuple(mesh_shape), mesh_dim_names=tuple(mesh_dim_names))


def __getattr__(name: str) -> object:
    if name == "CommsLoggerConfig":  # pydantic model, imported on first use
        from ds.comm.comms_logger_config import CommsLoggerConfig

        return CommsLoggerConfig
    raise AttributeError(f"module 'ds.comm' has no attribute {name!r}")


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "CollectiveTimeoutError",
    "CommError",
    "CommsLogger",
    "CommsLoggerConfig",
    "GroupMember",
    "ReduceOp",
    "TorchCommunicator",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_single",
    "all_reduce",
    "inference_all_reduce",
    "all_to_all",
    "all_to_all_quant_reduce",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "collective_timeout",
    "configure",
    "destroy_process_group",
    "gather",
    "gather_object",
    "get_backend",
    "get_world_group",
    "initialize_mesh_device",
    "get_comms_logger",
    "get_communicator",
    "get_global_rank",
    "get_local_rank",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "init_distributed",
    "init_process_group",
    "irecv",
    "is_available",
    "is_initialized",
    "isend",
    "log_summary",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_coalesced",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "set_communicator",
]
