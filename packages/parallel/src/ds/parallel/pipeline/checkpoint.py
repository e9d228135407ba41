"""Pipeline checkpoints: one file per layer (DeepSpeed's ``layer_XX-model_states.pt``) and its
optimizer state per parameter (``layer_XX-optim_states.pt``: the flat ZeRO partitions gathered
over the stage's data-parallel ranks and cut at the parameters), so a checkpoint saved with one
pipeline and data-parallel size continues exactly with any other; engine counters and the LR
schedule in ``pipeline_states.pt``. A tied module is saved once, under its first layer. With
tensor parallelism each TP rank writes its slices to its own files (:mod:`ds.parallel.pipeline.tp`)."""

from __future__ import annotations

import os
from typing import Any

import torch

from ds.interfaces.checkpoint import RecoveryScriptWriter
from ds.interfaces.errors import CheckpointError
from ds.interfaces.logging import get_logger

log = get_logger(__name__)

_LATEST = "latest"


def _barrier(engine: Any) -> None:
    if engine.comm is not None:
        engine.comm.barrier()


def _host(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in sd.items()}


def save(engine: Any, save_dir: str, tag: str, client_state: dict[str, Any] | None) -> None:
    from ds.parallel.pipeline.tp import layer_file, pipeline_layout, tp_index, tp_size

    engine.strategy.synchronize_parameters()
    tp, ti = tp_size(engine), tp_index(engine)
    layout = pipeline_layout(engine)  # collective over the pp group
    where = os.path.join(save_dir, tag)
    os.makedirs(where, exist_ok=True)
    mesh = engine.mesh
    dp_index = mesh.index("dp") if mesh is not None else 0
    if dp_index == 0:  # data-parallel ranks hold the same weights: one (per TP slice) writes
        for idx, sd in engine.module.layer_state_dicts().items():
            torch.save(_host(sd), os.path.join(where, layer_file(idx, "model", ti, tp)))
    states = _param_states(engine)  # collective over the stage's data-parallel ranks
    if dp_index == 0:
        by_layer: dict[int, dict[str, Any]] = {}
        owned = _owned_names(engine.module)
        for name, st in states.items():
            if name in owned:
                by_layer.setdefault(owned[name], {})[name] = st
        for idx, part in by_layer.items():
            torch.save(part, os.path.join(where, layer_file(idx, "optim", ti, tp)))
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
                # the TP size and slices, so another TP size can join and re-cut them
                "tp_size": tp,
                "tp_layout": layout,
                # layer file index -> tied key, so `ds checkpoint export` names a tied module's
                # tensors as the model does ("tied_modules.<key>.<name>")
                "tied_layers": {i: k for k, i in engine.module.tied_first_layer().items()},
            },
            os.path.join(where, "pipeline_states.pt"),
        )
    _barrier(engine)
    if is_global_zero:
        with open(os.path.join(save_dir, _LATEST), "w") as f:
            f.write(tag)
        _leave_recovery_script(engine, save_dir)
    _barrier(engine)


def _leave_recovery_script(engine: Any, save_dir: str) -> None:
    """``zero_to_fp32.py`` beside ``latest`` where DeepSpeed's pipeline engine leaves it: with its
    ZeRO-1 optimizer, or the bf16 one it uses at stage 0 (``ds checkpoint export`` reads layer
    files either way)."""
    writer = getattr(engine, "checkpoint_engine", None)
    if isinstance(writer, RecoveryScriptWriter) and (
        engine.config.stage >= 1 or engine.bfloat16_enabled()
    ):
        writer.write_recovery_script(save_dir)


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
    from ds.parallel.pipeline.tp import LayerFiles

    where = os.path.join(load_dir, tag)
    states = torch.load(os.path.join(where, "pipeline_states.pt"), weights_only=True)
    module = engine.module
    files = LayerFiles(engine, where, states)
    full: dict[str, torch.Tensor] = {}
    for prefix, idx in module.layer_files_needed().items():
        if not files.exists(idx, "model"):
            raise CheckpointError(f"{where} lacks layer {idx}'s model states")
        for k, v in files.model(idx, prefix).items():
            full[f"{prefix}.{k}"] = v
    engine.strategy.synchronize_parameters()
    module.load_state_dict(full, strict=load_module_strict)
    # The optimizer's masters are the strategy's copies: refresh them from the loaded weights.
    _refresh_masters(engine)
    if load_optimizer_states and not load_module_only:
        _load_param_states(engine, files)
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


def _layer_of(module: Any, name: str) -> int:
    """The global layer index whose files hold parameter ``name`` of a PipelineModule."""
    head, _, rest = name.partition(".")
    if head == "tied_modules":
        return int(module.tied_first_layer()[rest.partition(".")[0]])
    return int(head)


def _owned_names(module: Any) -> dict[str, int]:
    """Parameter name -> layer file, for the parameters this stage writes (a tied module's on
    the stage that owns it)."""
    owners = module.tied_stages()
    out = {}
    for name, _ in module.named_parameters():
        head, _, rest = name.partition(".")
        if head == "tied_modules" and owners[rest.partition(".")[0]][0] != module.stage_id:
            continue
        out[name] = _layer_of(module, name)
    return out


def _gathered(engine: Any, piece: torch.Tensor, padded: int) -> torch.Tensor:
    """The whole flat tensor from this rank's partition (stage 1: gathered over the stage's
    data-parallel ranks; stage 0 holds it whole)."""
    if piece.numel() == padded:
        return piece
    strategy = engine.strategy
    parts = [torch.empty_like(piece) for _ in range(strategy.world)]
    engine.comm.all_gather(parts, piece.contiguous(), group=strategy.ctx.group)
    return torch.cat(parts)


def _param_states(engine: Any) -> dict[str, dict[str, Any]]:
    """Parameter name -> the optimizer's state for it (tensors the master's size cut at the
    parameter, scalars as they are), on the host."""
    out: dict[str, dict[str, Any]] = {}
    for group in engine.strategy.groups:
        flat = group.flat
        state = engine.optimizer.state.get(group.master, {})
        whole: dict[str, Any] = {}
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.numel() == group.master.numel() > 1:
                whole[key] = _gathered(engine, value.detach(), flat.padded).cpu()
            else:
                whole[key] = value
        for name, p, off in zip(flat.names, flat.params, flat.offsets):
            out[name] = {
                k: (
                    v[off : off + p.numel()].clone()
                    if isinstance(v, torch.Tensor) and v.dim()
                    else v
                )
                for k, v in whole.items()
            }
    return out


def _load_param_states(engine: Any, layer_files: Any) -> None:
    """Rebuild each flat group's optimizer state from the per-parameter files, keeping this
    rank's partition (and, at another TP size, this rank's slice)."""
    files: dict[int, dict[str, Any]] = {}
    module = engine.module
    for group in engine.strategy.groups:
        flat = group.flat
        pieces: dict[str, list[tuple[int, torch.Tensor]]] = {}
        scalars: dict[str, Any] = {}
        for name, off in zip(flat.names, flat.offsets):
            idx = _layer_of(module, name)
            if idx not in files:
                found = layer_files.exists(idx, "optim")
                files[idx] = layer_files.optim(idx) if found else {}
            saved = files[idx].get(name)
            if saved is None:
                log.warning("no optimizer state saved for a parameter; it starts afresh", name=name)
                return
            for k, v in saved.items():
                if isinstance(v, torch.Tensor) and v.dim():
                    pieces.setdefault(k, []).append((off, v))
                else:
                    scalars[k] = v
        state: dict[str, Any] = dict(scalars)
        for k, parts in pieces.items():
            full = torch.zeros(flat.padded, dtype=parts[0][1].dtype)
            for off, v in parts:
                full[off : off + v.numel()] = v.reshape(-1)
            state[k] = full[group.lo : group.hi].to(group.master.device).clone()
        engine.optimizer.state[group.master] = state


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
    from ds.parallel.pipeline.tp import whole_tensors

    engine.strategy.synchronize_parameters()
    module = engine.module
    first = module.tied_first_layer()
    by_index = {v: k for k, v in first.items()}
    mine: dict[str, torch.Tensor] = {}
    for idx, sd in module.layer_state_dicts(keep_vars=True).items():
        prefix = f"tied_modules.{by_index[idx]}" if idx in by_index else str(idx)
        # Tensor-parallel slices joined over the stage's TP group (collective there).
        for k, v in _host(whole_tensors(engine, sd)).items():
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
