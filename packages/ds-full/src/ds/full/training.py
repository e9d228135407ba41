"""The training composition root: ``initialize`` resolves every collaborator and builds the engine.

The accelerator, communicator, CPU kernels, checkpoint engine, run ledger and readiness gate come
from the plug-in registry (``ds.accelerators``, ``ds.comm_backends``, ``ds.kernels``,
``ds.checkpoint_engines``, ``ds.ledgers``, ``ds.gates``); ds.zero's engine receives them as
constructor arguments and never imports them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ds.full import governance, moe, parallel
from ds.full.devices import bind_rank_device, check_placement, place_model
from ds.full.signals import signal_bus_for
from ds.interfaces import registry
from ds.interfaces.errors import ConfigError
from ds.interfaces.logging import get_logger
from ds.interfaces.telemetry import EventBus, StepMetrics

log = get_logger(__name__)


def init_distributed(dist_backend: str | None = None, **kwargs: Any) -> Any:
    """Create the default process group from the environment (launcher, torchrun, MPI, SLURM).

    First makes this rank's device current (``set_device(LOCAL_RANK)``, see
    :mod:`ds.full.devices`), so the communicator, ``ds.zero.Init`` and every later allocation
    land on it; the backend is the accelerator's (nccl for cuda, gloo for cpu).
    """
    from ds import comm

    accelerator = kwargs.pop("accelerator", None) or rank_accelerator()
    bind_rank_device(accelerator)
    out = comm.init_distributed(dist_backend=dist_backend, accelerator=accelerator, **kwargs)
    _leave_at_exit()
    return out


_exit_hook_registered = False


def _leave_at_exit() -> None:
    """Destroy the process group at exit, before the interpreter finalizes.

    Left to finalization, gloo's worker threads may drop the last reference to a finished
    collective's tensor after Python stopped handing out the GIL; the thread is ended mid-way
    through gloo's ``noexcept`` run loop and the process aborts ("terminate called without an
    active exception", exit 134). Destroying the group in an ``atexit`` hook joins those threads
    while the interpreter is whole. It runs in a helper thread with a bounded wait, so a group
    stuck on a dead peer cannot hang the exit. A script that destroys the group itself is left
    alone.
    """
    global _exit_hook_registered
    if _exit_hook_registered:
        return
    _exit_hook_registered = True
    import atexit

    atexit.register(_destroy_group, 10.0)


def _destroy_group(timeout_s: float) -> None:
    import threading

    import torch.distributed as tdist

    if not (tdist.is_available() and tdist.is_initialized()):
        return

    def destroy() -> None:
        try:
            tdist.destroy_process_group()
        except Exception as exc:  # exiting anyway; say why the group was not left cleanly
            log.warning(f"destroying the process group at exit failed: {exc}")

    t = threading.Thread(target=destroy, name="ds-destroy-process-group", daemon=True)
    t.start()
    t.join(timeout_s)


def rank_accelerator() -> Any:
    """The accelerator this process computes on (``DS_ACCELERATOR``, else cuda when usable)."""
    return registry.get(registry.ACCELERATORS, _accelerator_name())()


def initialize(
    args: Any = None,
    model: torch.nn.Module | None = None,
    optimizer: Any = None,
    model_parameters: Iterable[Any] | None = None,
    training_data: Any = None,
    lr_scheduler: Any = None,
    distributed_port: int = 29500,
    mpu: Any = None,
    dist_init_required: bool | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    config: Any = None,
    config_params: Any = None,
    *,
    ledger: Any = None,
    ledger_path: str | None = None,
    readiness_gate: bool | None = None,
) -> tuple[Any, Any, Any, Any]:
    """Build the training engine; returns ``(engine, optimizer, training_dataloader, lr_scheduler)``.

    ``config`` is a path to a DeepSpeed-style JSON file, a dict or a JSON string (``config_params``
    and ``args.deepspeed_config`` are accepted as in DeepSpeed). ``ledger_path`` (or the environment
    variable ``DS_LEDGER_PATH``) records the run in a tamper-evident ledger; with a ledger, a
    readiness gate scores the run's step telemetry (``readiness_gate=False`` turns it off).
    """
    from ds.zero.config import load_config
    from ds.zero.engine import ZeroEngine

    if model is None:
        raise ConfigError("initialize() needs model=: the torch.nn.Module to train")
    if mpu is not None:
        raise ConfigError(
            "mpu= (a Megatron-style model-parallel unit) is not supported by ds; set "
            "tensor_parallel.autotp_size / sequence_parallel_size in the config instead and leave "
            "mpu unset"
        )
    source = config if config is not None else config_params
    if source is None and args is not None:
        source = getattr(args, "deepspeed_config", None) or getattr(args, "ds_config", None)
    if source is None:
        raise ConfigError("initialize() needs config=: a JSON path, a dict or a JSON string")
    cfg = load_config(source)

    # The rank's device before the process group and before anything is allocated.
    accelerator = rank_accelerator()
    device = bind_rank_device(accelerator)
    # Refuse a model placed where this rank cannot train it before a process group exists.
    check_placement(model, device)
    init_distributed(
        distributed_port=distributed_port,
        dist_init_required=dist_init_required,
        config=cfg.model_dump(include={"comms_logger"}),
        accelerator=accelerator,
    )
    from ds import comm as dist

    communicator = dist.get_communicator()
    # Tensor/sequence parallel layouts change the model in place (AutoTP slices its linears on
    # the host, before the move, so a rank's device only ever holds its slices).
    from ds.full import pipeline

    pipelined = pipeline.is_pipeline(model)  # a PipelineModule: a pipeline mesh, its stage built
    mesh = (pipeline.build if pipelined else parallel.build)(cfg, communicator, model)
    moe.prepare(cfg, communicator, model, mesh)  # MoE layers join their expert groups
    place_model(model, device)  # a CPU model moves; split or foreign placements are errors

    kernels = _kernels_for(cfg.zero_optimization, device)

    gov = governance.build(
        cfg, communicator, ledger=ledger, ledger_path=ledger_path, kernels=kernels
    )
    # With a gate, every step's metrics carry the measured comm, offload and memory signals.
    events: EventBus = (
        signal_bus_for(cfg, accelerator, device)
        if governance.gate_wanted(gov, readiness_gate)
        else EventBus()
    )
    ledger_obj = gov.ledger
    ckpt_factory = registry.get(registry.CHECKPOINT_ENGINES, "default")
    checkpoint_engine = ckpt_factory(
        communicator,
        ledger=ledger_obj,
        events=events,
        async_save=cfg.checkpoint.async_save,
        **gov.checkpoint_kwargs,
    )
    engine = (pipeline.PipelineEngine if pipelined else ZeroEngine)(
        model,
        cfg,
        comm=communicator,
        kernels=kernels,
        accelerator=accelerator,
        checkpoint_engine=checkpoint_engine,
        optimizer=optimizer,
        lr_scheduler=lr_scheduler,
        model_parameters=model_parameters,
        training_data=training_data,
        collate_fn=collate_fn,
        events=events,
        mesh=mesh,
    )
    if "activation_checkpointing" in cfg.model_fields_set:
        from ds.zero import activation_checkpointing as checkpointing  # drives its checkpoint()

        checkpointing.configure(deepspeed_config=cfg.activation_checkpointing)
    from ds.full.monitoring import attach_monitors

    engine.monitor = attach_monitors(engine, cfg.model_dump(by_alias=True))
    engine.ledger = ledger_obj  # type: ignore[attr-defined]
    engine.boundary = gov.boundary  # type: ignore[attr-defined]
    if ledger_obj is not None:
        _record_run(engine, ledger_obj, cfg)
    engine.gate = governance.make_gate(gov, readiness_gate, events)  # type: ignore[attr-defined]
    from ds.full import autotune_trial

    autotune_trial.attach(engine)  # only under `ds autotune`
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


def _kernels_for(zero: Any, device: torch.device) -> Any:
    """The kernel provider the engine steps its optimizer (and swaps NVMe) with.

    Optimizer offload (cpu or nvme) keeps the masters on the host: the ``cpu`` provider. A model
    on an accelerator device steps on it with the provider registered under the device type
    (``ds.kernels: cuda``: Triton, or torch's fused optimizers without Triton), which also opens
    the async file I/O handle that NVMe parameter offload needs. A CPU model without offload
    needs none.
    """
    host_optimizer = zero.offload_optimizer_device in ("cpu", "nvme")
    if host_optimizer:
        return registry.get(registry.KERNELS, "cpu")()
    if device.type != "cpu" and registry.has_provider(registry.KERNELS, device.type):
        return registry.get(registry.KERNELS, device.type)()
    if zero.offload_param_device == "nvme":
        return registry.get(registry.KERNELS, "cpu")()
    return None


def _accelerator_name() -> str:
    name = os.environ.get("DS_ACCELERATOR")
    if name:
        return name
    return "cuda" if torch.cuda.is_available() else "cpu"


def _ledger(path: str | None, communicator: Any) -> Any:
    path = path or os.environ.get("DS_LEDGER_PATH")
    if not path:
        return None
    return registry.get(registry.LEDGERS, "default")(path, comm=communicator)


def _record_run(engine: Any, ledger: Any, cfg: Any) -> None:
    if engine.rank == 0:
        ledger.record_training_event(
            "run_start",
            {
                "world_size": engine.world_size,
                "zero_stage": engine.zero_optimization_stage(),
                "train_batch_size": engine.train_batch_size(),
                "config": cfg.model_dump(
                    mode="json",
                    exclude_defaults=True,
                    by_alias=True,
                    exclude={"ledger": {"signing_key"}},  # a private key never enters the record
                ),
            },
        )
    every = cfg.steps_per_print or 10

    def record(metrics: StepMetrics) -> None:
        if metrics.rank == 0 and metrics.step % every == 0:
            ledger.record_training_event(
                "train_step",
                {
                    "step": metrics.step,
                    "loss": metrics.loss,
                    "lr": metrics.lr,
                    "step_time_s": metrics.step_time_s,
                    "grad_norm": metrics.grad_norm,
                    "overflow": metrics.overflow,
                },
            )

    engine.events.subscribe(record, StepMetrics)
