"""Pipeline checkpoints: one file per layer (DeepSpeed's ``layer_XX-model_states.pt``), so a
checkpoint saved with one pipeline size loads with any other; engine counters and the LR
schedule in ``pipeline_states.pt``; each rank's optimizer state in
``pp_XX-dp_XX-optim_states.pt``, restored when the layout (stages and data-parallel size) is the
same, otherwise the optimizer starts fresh from the loaded weights (with a warning)."""

from __future__ import annotations

import os
from typing import Any

import torch

from ds.interfaces.errors import CheckpointError
from ds.interfaces.logging import get_logger

log = get_logger(__name__)

_LATEST = "latest"


def _layer_file(idx: int) -> str:
    return f"layer_{idx:02d}-model_states.pt"


def _barrier(engine: Any) -> None:
    if engine.comm is not None:
        engine.comm.barrier()


def _host(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in sd.items()}


def save(engine: Any, save_dir: str, tag: str, client_state: dict[str, Any] | None) -> None:
    engine.strategy.synchronize_parameters()
    where = os.path.join(save_dir, tag)
    os.makedirs(where, exist_ok=True)
    mesh = engine.mesh
    dp_index = mesh.index("dp") if mesh is not None else 0
    if dp_index == 0:  # data-parallel ranks hold the same weights: one writes them
        for idx, sd in engine.module.layer_state_dicts().items():
            torch.save(_host(sd), os.path.join(where, _layer_file(idx)))
    torch.save(
        engine.optimizer.state_dict(),
        os.path.join(where, f"pp_{engine.stage_id:02d}-dp_{dp_index:02d}-optim_states.pt"),
    )
    is_global_zero = engine.comm is None or engine.comm.get_rank() == 0
    if is_global_zero:
        torch.save(
            {
                "global_steps": engine.global_steps,
                "global_samples": engine.global_samples,
                "micro_steps": engine.micro_steps,
                "skipped_steps": engine.skipped_steps,
                "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler else None,
                "loss_scaler": engine.loss_scaler.state_dict(),
                "client_state": dict(client_state or {}),
                "num_stages": engine.num_stages,
                "dp_size": engine.dp_size,
            },
            os.path.join(where, "pipeline_states.pt"),
        )
    _barrier(engine)
    if is_global_zero:
        with open(os.path.join(save_dir, _LATEST), "w") as f:
            f.write(tag)
    _barrier(engine)


def load(
    engine: Any,
    load_dir: str,
    tag: str | None = None,
    *,
    load_optimizer_states: bool = True,
    load_lr_scheduler_states: bool = True,
    load_module_strict: bool = True,
    load_module_only: bool = False,
) -> tuple[str | None, dict[str, Any]]:
    if tag is None:
        latest = os.path.join(load_dir, _LATEST)
        if not os.path.exists(latest):
            log.warning("no checkpoint found", directory=load_dir)
            return None, {}
        with open(latest) as f:
            tag = f.read().strip()
    where = os.path.join(load_dir, tag)
    states = torch.load(os.path.join(where, "pipeline_states.pt"), weights_only=False)
    module = engine.module
    full: dict[str, torch.Tensor] = {}
    for prefix, idx in module.layer_files_needed().items():
        path = os.path.join(where, _layer_file(idx))
        if not os.path.exists(path):
            raise CheckpointError(f"{path} is missing: the checkpoint lacks layer {idx}")
        for k, v in torch.load(path, weights_only=True).items():
            full[f"{prefix}.{k}"] = v
    engine.strategy.synchronize_parameters()
    module.load_state_dict(full, strict=load_module_strict)
    # The optimizer's masters are the strategy's copies: refresh them from the loaded weights.
    _refresh_masters(engine)
    same_layout = (states["num_stages"], states["dp_size"]) == (engine.num_stages, engine.dp_size)
    dp_index = engine.mesh.index("dp") if engine.mesh is not None else 0
    optim = os.path.join(where, f"pp_{engine.stage_id:02d}-dp_{dp_index:02d}-optim_states.pt")
    if load_optimizer_states and not load_module_only:
        if same_layout and os.path.exists(optim):
            engine.optimizer.load_state_dict(torch.load(optim, weights_only=False))
        else:
            log.warning(
                "optimizer state not restored: the checkpoint has another pipeline layout",
                saved_stages=states["num_stages"],
                saved_dp=states["dp_size"],
                stages=engine.num_stages,
                dp=engine.dp_size,
            )
    if not load_module_only:
        engine.global_steps = int(states["global_steps"])
        engine.global_samples = int(states["global_samples"])
        engine.micro_steps = int(states["micro_steps"])
        engine.skipped_steps = int(states["skipped_steps"])
        if load_lr_scheduler_states and engine.lr_scheduler is not None and states["lr_scheduler"]:
            engine.lr_scheduler.load_state_dict(states["lr_scheduler"])
        if states.get("loss_scaler"):
            engine.loss_scaler.load_state_dict(states["loss_scaler"])
    return where, dict(states.get("client_state") or {})


def _refresh_masters(engine: Any) -> None:
    """Copy the module's (just loaded) weights into the strategy's flat masters."""
    with torch.no_grad():
        for group in getattr(engine.strategy, "groups", []):
            flat = group.flat
            for p, off in zip(flat.params, flat.offsets):
                flat.flat[off : off + p.numel()].copy_(p.detach().reshape(-1))
            if not group.master_is_view:
                group.master.copy_(flat.flat[group.lo : group.hi].to(group.master.dtype))


def full_state_dict(engine: Any) -> dict[str, torch.Tensor]:
    """The whole model's state dict, named as a one-stage PipelineModule of the same layers
    names it (``"3.weight"``, ``"tied_modules.embed.weight"``). Collective over the world."""
    engine.strategy.synchronize_parameters()
    module = engine.module
    first = module.tied_first_layer()
    by_index = {v: k for k, v in first.items()}
    mine: dict[str, torch.Tensor] = {}
    for idx, sd in module.layer_state_dicts().items():
        prefix = f"tied_modules.{by_index[idx]}" if idx in by_index else str(idx)
        for k, v in _host(sd).items():
            mine[f"{prefix}.{k}"] = v
    if engine.comm is None or engine.num_stages == 1:
        return mine
    parts: list[Any] = [None] * engine.num_stages
    engine.comm.all_gather_object(parts, mine, group=engine.mesh.group("pp"))
    out: dict[str, torch.Tensor] = {}
    for part in parts:
        out.update(part)
    return out


__all__ = ["full_state_dict", "load", "save"]
