"""The rank's device: chosen from its local rank before anything is allocated, and the model
placed on it.

Rules (docs/training.md, "GPU"): local rank ``r`` computes on index ``r`` of the devices this
process can see; the ds launcher gives every rank of a node the same visibility list in local-rank
order, as torchrun does. A runner that binds one device per rank (``srun --gpus-per-task=1``,
``CUDA_VISIBLE_DEVICES`` set per rank) leaves one visible device, which every rank then uses as
index 0. A model handed over on the CPU is moved to the rank's device; a model already wholly on
the rank's device stays; anything else (parameters on two devices, or on another accelerator
device than the rank's) is a one-line error naming the parameter and both devices.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from ds.interfaces.errors import ConfigError

# Local-rank variables of the launchers ds runs under, first present wins (torchrun/ds, OpenMPI,
# MPICH/Intel MPI, SLURM); read before the process group exists so the device is set first.
LOCAL_RANK_VARS = (
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "PMI_LOCAL_RANK",
    "SLURM_LOCALID",
)


def local_rank(environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    for var in LOCAL_RANK_VARS:
        value = env.get(var, "").strip()
        if value:
            if not value.isdigit():
                raise ConfigError(f"{var}={value!r} is not a local rank (a number >= 0)")
            return int(value)
    return 0


def device_index(rank: int, count: int, kind: str, environ: Mapping[str, str]) -> int:
    """The device index local rank ``rank`` computes on among ``count`` visible devices."""
    if rank < count:
        return rank
    if count == 1:
        return 0  # the runner bound one device to this rank
    seen = ", ".join(f"{v}={environ[v]!r}" for v in _visibility_vars(environ)) or "no visibility"
    raise ConfigError(
        f"local rank {rank} has no {kind} device: {count} are visible to this process ({seen}); "
        f"start at most {count} rank(s) per node (ds run --nproc {count})"
    )


def _visibility_vars(environ: Mapping[str, str]) -> list[str]:
    return [v for v in environ if v.endswith("_VISIBLE_DEVICES")]


def bind_rank_device(accelerator: Any, environ: Mapping[str, str] | None = None) -> torch.device:
    """Make this rank's device current (``set_device``) and return it.

    Call before the process group and before any allocation: NCCL communicators, the caching
    allocator and RNG default to the current device.
    """
    env = os.environ if environ is None else environ
    count = int(accelerator.device_count())
    if count < 1:
        raise ConfigError(
            f"the {accelerator.name()} accelerator sees no device; check the driver and the "
            "visibility variables, or set DS_ACCELERATOR=cpu"
        )
    index = device_index(local_rank(env), count, accelerator.name(), env)
    accelerator.set_device(index)
    return torch.device(accelerator.device_name(index))


def _same(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def check_placement(model: torch.nn.Module, device: torch.device) -> None:
    """Raise ConfigError, naming the tensor and both devices, for a model split over two devices
    or one on another accelerator device than this rank's; nothing is moved or allocated.
    """
    tensors = [*model.named_parameters(), *model.named_buffers()]
    if not tensors:
        return
    first_name, first = tensors[0]
    for name, t in tensors[1:]:
        if not _same(t.device, first.device):
            raise ConfigError(
                f"model tensors on two devices: {name!r} is on {t.device} but {first_name!r} is "
                f"on {first.device}; build the model on one device (the CPU, or {device})"
            )
    where = first.device
    if where.type != "cpu" and not _same(where, device):
        raise ConfigError(
            f"parameter {first_name!r} is on {where} but this rank's device is {device} (local "
            f"rank {local_rank()}); build the model on the CPU or on {device}, or leave the "
            "placement to ds.initialize"
        )


def place_model(model: torch.nn.Module, device: torch.device) -> bool:
    """Move a CPU model to ``device``; True when it was moved.

    Refuses (see :func:`check_placement`) a model split over two devices or one on another
    accelerator device than this rank's.
    """
    check_placement(model, device)
    tensors = [*model.parameters(), *model.buffers()]
    if not tensors or _same(tensors[0].device, device):
        return False
    model.to(device)
    return True
