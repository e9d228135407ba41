"""Pipeline parallelism in ``ds.initialize``: a ``PipelineModule`` gets a pipeline mesh (with
its stage's layers split over the stage's TP group) and :class:`PipelineEngine`, the composition
of ``ds.parallel.pipeline``'s :class:`~ds.parallel.pipeline.engine.PipelineTraining` with
``ds.zero``'s engine. Only the wiring lives here: the schedules, runner, engine half, checkpoints
and PP x TP files are in ``ds.parallel.pipeline``.
"""

from __future__ import annotations

from typing import Any

from ds.interfaces.errors import ConfigError
from ds.parallel.pipeline.engine import (
    DEFAULT_SCHEDULE,
    PipelineTraining,
    check_stage_tp,
    is_pipeline,
    settings,
)
from ds.zero.engine import ZeroEngine


def build(cfg: Any, communicator: Any, model: Any) -> Any:
    """The pipeline mesh, with ``model`` built for this rank's stage and, with
    ``tensor_parallel.autotp_size``, that stage's layers split over its TP group. Collective."""
    from ds.full import parallel
    from ds.parallel.mesh import build_mesh, mesh_shape_from_config
    from ds.parallel.pipeline import check_stages

    want = parallel.sizes(cfg)
    stages, _ = settings(cfg, model)
    if want.sp > 1:
        parallel.refuse_pipeline_sp(f"a PipelineModule of {stages} stages", want.sp)
    world = int(communicator.get_world_size()) if communicator.is_initialized() else 1
    check_stages(stages, world)
    check_stage_tp(world, stages, want.tp)
    shape = mesh_shape_from_config(world, pp=stages, tp=want.tp)
    rank = int(communicator.get_rank()) if communicator.is_initialized() else 0
    model.bind(stages, shape.pp_index(rank))
    if model.num_parts > len(model._layer_specs):
        raise ConfigError(
            f"num_stages={stages} x num_virtual_stages={model.num_virtual_stages} exceeds the "
            f"number of layers {len(model._layer_specs)}; use fewer stages"
        )
    mesh = build_mesh(communicator, shape)
    parallel._current = mesh
    if want.tp > 1:
        from ds.parallel.tp import autotp

        # Only this stage's layers exist here: AutoTP splits them over the stage's TP group
        # (tp ranks are adjacent and inside one stage), and the pp group pairs equal TP indices,
        # so each TP rank exchanges its (replicated) boundary activation with its peer only.
        partition = cfg.tensor_parallel.partition_config if cfg.tensor_parallel else None
        autotp(model, mesh, communicator, partition_config=partition)
        model.mark_tied_replicas()  # a tied weight AutoTP sliced is a new parameter
    return mesh


class PipelineEngine(PipelineTraining, ZeroEngine):
    """``train_batch`` / ``eval_batch`` over a pipeline of stages, ZeRO 0/1 within each stage."""

    def __init__(self, model: Any, config: Any, *, mesh: Any = None, **kwargs: Any) -> None:
        from ds.zero.config import load_config

        cfg = load_config(config)
        self._pipeline_setup(model, cfg, mesh, kwargs.get("comm"))
        ZeroEngine.__init__(self, model, cfg, mesh=mesh, **kwargs)
        self._pipeline_bind(model)


__all__ = [
    "DEFAULT_SCHEDULE",
    "PipelineEngine",
    "build",
    "check_stage_tp",
    "is_pipeline",
    "settings",
]
