"""Model parallelism in ``ds.initialize``: the device mesh, AutoTP and Ulysses from the config.

``tensor_parallel.autotp_size`` (or DeepSpeed's ``tensor_parallel.tp.tp_size``) and
``sequence_parallel_size`` choose the mesh; what is left of the world is data parallel. The
sizes are checked against the world and the model's head counts before the model is touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ds.interfaces.errors import ConfigError

# The mesh of the last ds.initialize (or tp_model_init) in this process: what the DeepSpeed names
# in ``deepspeed.utils.groups`` report.
_current: Any = None


def current_mesh() -> Any:
    return _current


@dataclass(frozen=True)
class ParallelSizes:
    tp: int = 1
    sp: int = 1

    @property
    def active(self) -> bool:
        return self.tp > 1 or self.sp > 1


def sizes(cfg: Any) -> ParallelSizes:
    """The tensor- and sequence-parallel sizes a config asks for (1 when unset)."""
    found = ParallelSizes(*cfg.model_parallel_sizes())
    if found.active:
        _refuse_unsupported(cfg, found)
    return found


def _refuse_unsupported(cfg: Any, found: ParallelSizes) -> None:
    what = f"tensor_parallel.autotp_size={found.tp}, sequence_parallel_size={found.sp}"
    pipeline = cfg.pipeline
    stages = pipeline.get("stages", 1) if isinstance(pipeline, dict) else 1
    if found.sp > 1 and stages not in (None, 1):
        # TP composes with stages (each stage's layers split over its TP group); Ulysses would
        # need the stage boundaries to carry sequence-sharded activations, which they do not.
        refuse_pipeline_sp(f"pipeline.stages={stages}", found.sp)
    expert = cfg.expert_parallel
    if isinstance(expert, dict) and expert and expert.get("enabled", True) and found.sp > 1:
        # Expert parallelism folds onto tensor parallelism (ds.full.moe_folding), not onto
        # Ulysses: its all-to-alls would need the sequence shards' routes exchanged too.
        raise ConfigError(
            f"expert_parallel with {what}: expert parallelism does not compose with sequence "
            "parallelism in ds; set sequence_parallel_size to 1 (it folds onto "
            "tensor_parallel.autotp_size)"
        )


def refuse_pipeline_sp(what: str, sp: int) -> None:
    raise ConfigError(
        f"{what} with sequence_parallel_size={sp}: pipeline parallelism does not compose with "
        "sequence parallelism in ds yet; set sequence_parallel_size to 1 (pipeline stages "
        "compose with tensor_parallel.autotp_size)"
    )


def build(cfg: Any, communicator: Any, model: torch.nn.Module) -> Any:
    """Build the mesh and make ``model`` tensor/sequence parallel in place; None without either.

    Collective: every rank calls it with the same config.
    """
    want = sizes(cfg)
    if not want.active:
        return None
    from ds.parallel.mesh import build_mesh, mesh_shape_from_config

    world = int(communicator.get_world_size()) if communicator.is_initialized() else 1
    shape = mesh_shape_from_config(world, want.tp, want.sp)
    config = getattr(model, "config", None)
    if want.sp > 1:
        from ds.parallel.sequence import check_model_config

        if config is None:
            raise ConfigError(
                f"sequence_parallel_size={want.sp} needs a transformers model (one with .config) "
                "whose attention goes through transformers' AttentionInterface; wrap other "
                "models' attention in ds.parallel.sequence.DistributedAttention yourself"
            )
        check_model_config(config, want.sp)
    global _current
    prepared = getattr(model, "_ds_mesh", None)
    if prepared is not None:  # tp_model_init already built the mesh and split the model
        if (prepared.shape.tp, prepared.shape.sp) != (want.tp, want.sp):
            raise ConfigError(
                f"the model was split by tp_model_init for tp={prepared.shape.tp} but the config "
                f"asks for tensor_parallel.autotp_size={want.tp}, sequence_parallel_size="
                f"{want.sp}; make them agree"
            )
        _current = prepared
        return prepared
    mesh = build_mesh(communicator, shape)
    _current = mesh
    if want.tp > 1:
        from ds.parallel.tp import autotp

        partition = cfg.tensor_parallel.partition_config if cfg.tensor_parallel else None
        autotp(model, mesh, communicator, partition_config=partition, whole=_moe_blocks(cfg, model))
    if want.sp > 1:
        from ds.parallel.sequence import use_ulysses_attention

        use_ulysses_attention(model, communicator, mesh.group("sp"))
    return mesh


def _moe_blocks(cfg: Any, model: torch.nn.Module) -> list[str]:
    """With expert parallelism on, the router and experts of each MoE block (a module with
    ``experts`` and a ``gate`` or ``router``): expert parallelism distributes them, so tensor
    parallelism leaves them whole (their TP ranks share the routes, ds.parallel.moe.folded)."""
    expert = cfg.expert_parallel
    if not (isinstance(expert, dict) and expert and expert.get("enabled", True)):
        return []
    found = []
    for name, module in model.named_modules():
        if hasattr(module, "experts"):
            for child in ("experts", "gate", "router"):
                if isinstance(getattr(module, child, None), torch.nn.Module):
                    found.append(f"{name}.{child}" if name else child)
    return found


def tp_model_init(model: torch.nn.Module, tp_size: int, communicator: Any) -> torch.nn.Module:
    """Split ``model`` over ``tp_size`` tensor-parallel ranks now (DeepSpeed's
    ``deepspeed.tp_model_init``); ``ds.initialize`` then uses this mesh."""
    from ds.parallel.mesh import build_mesh, mesh_shape_from_config
    from ds.parallel.tp import autotp

    global _current
    if not communicator.is_initialized():
        raise ConfigError(
            "tp_model_init needs the process group: call deepspeed.init_distributed() (or "
            "ds.init_distributed()) first"
        )
    shape = mesh_shape_from_config(int(communicator.get_world_size()), int(tp_size), 1)
    mesh = build_mesh(communicator, shape)
    autotp(model, mesh, communicator)
    model._ds_mesh = mesh  # type: ignore[assignment]
    _current = mesh
    return model


__all__ = [
    "ParallelSizes",
    "build",
    "current_mesh",
    "refuse_pipeline_sp",
    "sizes",
    "tp_model_init",
]
