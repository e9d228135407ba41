"""How the engine is put together: the weights every rank starts from, the log level, the
mesh check, the strategy's context, the LR schedule and the loss scaler."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch

from ds.interfaces.errors import ConfigError
from ds.interfaces.moe import replica_group
from ds.interfaces.parallel import ParallelMesh, tp_dim
from ds.zero.config import DsConfig
from ds.zero.loss_scaler import DynamicLossScaler, LossScaler, StageZeroLossScaler
from ds.zero.lr_schedules import build_schedule
from ds.zero.optim.none import has_optimizer


def check_mesh(cfg: DsConfig, mesh: ParallelMesh | None) -> None:
    """The config's tensor- and sequence-parallel sizes must be the mesh's."""
    tp, sp = cfg.model_parallel_sizes()
    have = (mesh.shape.tp, mesh.shape.sp) if mesh is not None else (1, 1)
    if (tp, sp) != have:
        raise ConfigError(
            f"the config asks for tensor_parallel.autotp_size={tp} and "
            f"sequence_parallel_size={sp} but the engine got a mesh of tp={have[0]}, "
            f"sp={have[1]}; build it with ds.full.initialize (which builds the mesh and "
            "applies AutoTP/Ulysses from the config) or pass a matching mesh="
        )


def broadcast_module(engine: Any) -> None:
    """Ranks must start from identical weights; rank 0's initialisation wins (as in DDP)."""
    comm, mesh, module = engine.comm, engine.mesh, engine.module
    if comm is None:
        return
    # ``src`` is a global rank: the first rank of the reduction group (rank 0 without a mesh).
    src = mesh.ranks("dp_sp")[0] if mesh is not None else 0
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            replicas = replica_group(t)
            if replicas is None:
                comm.broadcast(t.data, src=src, group=engine.group)
            elif replicas.size > 1:  # an expert: only its replica group holds it
                comm.broadcast(t.data, src=replicas.ranks[0], group=replicas.group)
        if mesh is not None and mesh.shape.tp > 1:
            # Replicated parameters must also agree across the tensor-parallel ranks; experts
            # differ between TP ranks (expert parallelism folded onto TP spreads them over the
            # TP ranks too; their replica group holds the copies).
            tp_src = mesh.ranks("tp")[0]
            for t in list(module.parameters()) + list(module.buffers()):
                if tp_dim(t) is None and replica_group(t) is None:
                    comm.broadcast(t.data, src=tp_src, group=mesh.group("tp"))


def build_scheduler(cfg: DsConfig, client: Any, optimizer: Any) -> Any:
    """The client's LR scheduler (or its factory called on ``optimizer``), else the config's.
    None without an optimizer, as in DeepSpeed (a section then has nothing to schedule)."""
    scheduler = cfg.scheduler
    if not has_optimizer(optimizer):
        if client is not None or scheduler is not None:
            warnings.warn(
                "the LR scheduler is ignored: the engine has no optimizer for it to schedule "
                "(add an 'optimizer' section or pass optimizer= to initialize() to train)",
                UserWarning,
                stacklevel=3,
            )
        return None
    if client is not None and scheduler is not None:
        raise ConfigError(
            "both config.scheduler and an lr_scheduler passed to initialize(); remove one"
        )
    if client is not None:
        if callable(client) and not hasattr(client, "step"):
            return client(optimizer)
        return client
    if scheduler is None:
        return None
    params = scheduler.resolved_params()
    autos = [k for k, v in params.items() if v == "auto"]
    if autos:
        raise ConfigError(
            f"scheduler.params {', '.join(autos)} are 'auto' but nothing filled them; set numbers"
        )
    return build_schedule(scheduler.type, optimizer, params)


def hidden_size(model: torch.nn.Module) -> int | None:
    config = getattr(model, "config", None)
    for attr in ("hidden_size", "d_model", "n_embd"):
        value = getattr(config, attr, None) or getattr(model, attr, None)
        if isinstance(value, int):
            return value
    return None


def device_of(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def apply_log_level(level: Any) -> None:
    """``log_level`` (DeepSpeed's key): the level of ds's library loggers, the ``ds`` tree."""
    if level is None:
        return
    value = logging.getLevelName(str(level).upper())
    if not isinstance(value, int):
        raise ConfigError(
            f"log_level={level!r} is not a logging level; use debug, info, warning, error or "
            "critical"
        )
    logging.getLogger("ds").setLevel(value)


def loss_scaler(cfg: DsConfig) -> LossScaler:
    fp16 = cfg.fp16
    if cfg.precision != "fp16":
        return LossScaler(1.0)
    if fp16.loss_scale > 0:
        return LossScaler(fp16.loss_scale)
    # Without ZeRO partitioning DeepSpeed scales by its FP16_Optimizer's rules.
    scaler = StageZeroLossScaler if int(cfg.zero_optimization.stage) == 0 else DynamicLossScaler
    return scaler(
        init_scale=2.0**fp16.initial_scale_power,
        scale_window=fp16.loss_scale_window,
        min_scale=fp16.min_loss_scale,
        hysteresis=fp16.hysteresis,
        consecutive_hysteresis=fp16.consecutive_hysteresis,
    )
