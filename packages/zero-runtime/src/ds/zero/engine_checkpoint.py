"""The engine's checkpoints: what ``save_checkpoint`` writes beside the strategy's shards
(buffers, frozen parameters, counters, schedule and scaler states, each rank's RNG) and how
``load_checkpoint`` reads it back, at this tensor-parallel size or another (:mod:`tp_reshard`).

The checkpoint engine (ds-checkpoint-ledger) stores the shards; the layout of the names is the
strategy's. With tensor parallelism each rank's tensors carry an ``@tp<index>of<size>`` suffix,
except those of expert parameters that are rows of a stacked tensor (:class:`ExpertSlice`): their
names already say which rows they hold, whatever the TP rank, so they are stored unsuffixed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from ds.interfaces.checkpoint import (
    LoadRequest,
    RecoveryScriptWriter,
    ShardedStateDict,
    ShardedTensor,
    TensorMeta,
)
from ds.interfaces.errors import ProviderNotFoundError
from ds.interfaces.logging import get_logger
from ds.interfaces.moe import CHECKPOINT_OBJECTS_ATTR, expert_slice, replica_group
from ds.zero import tp_reshard
from ds.zero.param_groups import regroup
from ds.zero.rng_state import rng_state, set_rng_state
from ds.zero.stages.sharded_io import logical_place

log = get_logger(__name__)

#: The engine's counters, saved and restored by name.
COUNTERS = ("global_steps", "global_samples", "micro_steps", "skipped_steps")


def require_checkpoint_engine(engine: Any) -> Any:
    if engine.checkpoint_engine is None:
        raise ProviderNotFoundError(
            "this engine has no checkpoint engine; create it with ds.full.initialize() (which "
            "wires one from ds-checkpoint-ledger) or pass checkpoint_engine="
        )
    return engine.checkpoint_engine


def frozen_params(engine: Any) -> list[tuple[str, torch.nn.Parameter]]:
    """Parameters no optimizer updates (requires_grad=False), whole on every rank at stages
    0-2: checkpoints carry them as ``frozen.<name>``, as DeepSpeed keeps them apart (stage
    3 keeps them sharded: its strategy saves and loads them)."""
    if engine.config.stage == 3:
        return []
    return [(n, p) for n, p in engine.module.named_parameters() if not p.requires_grad]


def tp_suffix(engine: Any) -> str:
    """``@tp<index>of<size>`` on a tensor-parallel mesh, else empty."""
    mesh = engine.mesh
    if mesh is None or mesh.shape.tp == 1:
        return ""
    return f"@tp{mesh.index('tp')}of{mesh.shape.tp}"


def _whole(key: str, t: torch.Tensor, flat: torch.Tensor) -> ShardedTensor:
    shape, offset = logical_place(t)
    return ShardedTensor(
        TensorMeta(key, shape, str(t.dtype).removeprefix("torch.")), offset, flat
    )


def _writes_frozen(engine: Any, p: torch.Tensor) -> bool:
    """Whether this rank writes frozen parameter ``p``: data-parallel rank 0, or for an expert
    parameter (held by some ranks only) the first rank of its replica group."""
    replicas = replica_group(p)
    if replicas is None:
        return bool(engine.rank == 0)
    rank = engine.comm.get_rank() if engine.comm is not None else 0  # global, as replicas.ranks
    return bool(rank == replicas.ranks[0])


def _renamed(
    tensors: dict[str, ShardedTensor], rename: Callable[[str], str]
) -> dict[str, ShardedTensor]:
    return {
        rename(k): ShardedTensor(
            TensorMeta(rename(t.meta.name), t.meta.shape, t.meta.dtype), t.offset, t.local
        )
        for k, t in tensors.items()
    }


def save_checkpoint(
    engine: Any,
    save_dir: str,
    tag: str | None,
    client_state: dict[str, Any] | None,
    exclude_frozen_parameters: bool,
) -> None:
    ckpt = require_checkpoint_engine(engine)
    tag = tag or f"global_step{engine.global_steps}"
    state = engine.strategy.state_dict()
    if exclude_frozen_parameters:
        state.tensors = {k: t for k, t in state.tensors.items() if not k.startswith("frozen.")}
    if engine.rank == 0:
        for name, buf in engine.module.named_buffers():
            key = f"buffer.{name}"
            state.tensors[key] = _whole(key, buf, buf.detach().reshape(-1).clone())
    for name, p in [] if exclude_frozen_parameters else frozen_params(engine):
        if _writes_frozen(engine, p):
            key = f"frozen.{name}"
            state.tensors[key] = _whole(key, p, p.detach().reshape(-1).to("cpu", copy=True))
    state.objects.update({name: getattr(engine, name) for name in COUNTERS})
    state.objects.update(
        {
            "step": engine.global_steps,
            "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler else None,
            "loss_scaler": engine.loss_scaler.state_dict(),
            "client_state": dict(client_state or {}),
            "ds_config": engine.ds_config.model_dump(mode="json", by_alias=True),
            "zero_stage": engine.config.stage,
            "world_size": engine.world_size,
        }
    )
    describe = getattr(engine.module, CHECKPOINT_OBJECTS_ATTR, None)
    if describe is not None:  # e.g. AutoEP's layer layout (ds.interfaces.moe)
        state.objects.update(describe(engine.module))
    state.rank_objects.update(rng_state(engine.accelerator))
    state.objects["optimizer.group_origin"] = list(engine._group_origin)
    state.objects["optimizer.group_params"] = [list(g) for g in engine._group_param_names]
    suffix = tp_suffix(engine)
    if suffix:
        # Each tensor-parallel rank holds other slices under the same names: its tensors
        # are stored under its own keys (the layout's TP size is part of the key).
        stacked = expert_slice_names(engine)
        state.tensors = _renamed(
            state.tensors, lambda k: k if tp_reshard.param_of(k) in stacked else k + suffix
        )
        state.objects["tensor_parallel_size"] = engine.mesh.shape.tp
        # What a load at another TP size needs to join the slices.
        state.objects["tensor_parallel_layout"] = {
            k: list(v) for k, v in tp_reshard.layout_of(engine.module).items()
        }
    handle = ckpt.save(save_dir, tag, state, async_save=engine.ds_config.checkpoint.async_save)
    if engine.config.stage >= 1:
        leave_recovery_script(engine, save_dir)
    gather16 = engine.ds_config.zero_optimization.gather_16bit_weights_on_model_save
    if not engine.ds_config.checkpoint.async_save or (engine.config.stage == 3 and gather16):
        # The consolidated weights file goes into the committed tag directory.
        handle.wait()
    if engine.config.stage == 3 and gather16:
        engine.save_16bit_model(os.path.join(save_dir, tag))


def expert_slice_names(engine: Any) -> set[str]:
    """Parameters that are this rank's rows of a stacked expert tensor (ds.interfaces.moe)."""
    return {n for n, p in engine.module.named_parameters() if expert_slice(p) is not None}


def leave_recovery_script(engine: Any, save_dir: str) -> None:
    """Rank 0 leaves ``zero_to_fp32.py`` beside ``latest``, where DeepSpeed leaves it for the
    checkpoints of its ZeRO (and bf16) optimizers; a checkpoint engine of the user's own that
    cannot write one is left as it is."""
    ckpt = engine.checkpoint_engine
    rank = engine.comm.get_rank() if engine.comm is not None else 0  # global: not the dp rank
    if rank == 0 and isinstance(ckpt, RecoveryScriptWriter):
        ckpt.write_recovery_script(save_dir)


def load_checkpoint(
    engine: Any,
    load_dir: str,
    tag: str | None,
    load_optimizer_states: bool,
    load_lr_scheduler_states: bool,
) -> tuple[str | None, dict[str, Any]]:
    ckpt = require_checkpoint_engine(engine)
    tag = tag or ckpt.latest_tag(load_dir)
    if tag is None:
        log.warning("no checkpoint found", directory=load_dir)
        return None, {}
    state = _read(engine, ckpt, load_dir, tag, load_optimizer_states)
    if not load_optimizer_states:
        state.objects.pop("optimizer.scalar_state", None)
    engine.strategy.load_state_dict(state)
    with torch.no_grad():
        for name, buf in engine.module.named_buffers():
            shard = state.tensors.get(f"buffer.{name}")
            if shard is not None:
                buf.copy_(shard.local.reshape(buf.shape))
        for name, p in frozen_params(engine):
            shard = state.tensors.get(f"frozen.{name}")
            if shard is not None:
                p.data.copy_(shard.local.reshape(p.shape))
    obj = state.objects
    if obj.get("world_size") != engine.world_size and engine.rank == 0:
        log.info(
            "resharded checkpoint",
            saved_world_size=obj.get("world_size"),
            world_size=engine.world_size,
        )
    for name in COUNTERS:
        setattr(engine, name, int(obj.get(name, 0)))
    if load_lr_scheduler_states and engine.lr_scheduler is not None and obj.get("lr_scheduler"):
        engine.lr_scheduler.load_state_dict(obj["lr_scheduler"])
    if obj.get("loss_scaler"):
        engine.loss_scaler.load_state_dict(obj["loss_scaler"])
    if state.rank_objects:
        set_rng_state(state.rank_objects, engine.accelerator)
    return os.path.join(load_dir, tag), dict(obj.get("client_state") or {})


def _read(
    engine: Any, ckpt: Any, load_dir: str, tag: str, load_optimizer_states: bool
) -> ShardedStateDict:
    """This rank's part of the checkpoint, under the names this engine's strategy uses."""
    meta = dict(ckpt.metadata(load_dir, tag))
    mesh = engine.mesh
    tp_size = mesh.shape.tp if mesh is not None else 1

    def make_requests(logical: dict[str, TensorMeta]) -> list[LoadRequest]:
        requests = engine.strategy.load_requests(logical)
        if not load_optimizer_states:
            requests = [r for r in requests if not r.name.startswith("optim.")]
        for name, buf in engine.module.named_buffers():
            if f"buffer.{name}" in logical:
                requests.append(LoadRequest(f"buffer.{name}", 0, buf.numel()))
        for name, p in frozen_params(engine):
            if f"frozen.{name}" in logical:
                requests.append(LoadRequest(f"frozen.{name}", logical_place(p)[1], p.numel()))
            else:  # saved without them (exclude_frozen_parameters): they keep their values
                log.warning("checkpoint holds no frozen parameter; it keeps its values",
                            parameter=name)  # fmt: skip
        return requests

    if tp_reshard.saved_tp_size(meta) != tp_size:
        # Another tensor-parallel layout: join the saved slices and cut this rank's.
        saved_layout = ckpt.load(load_dir, tag, [], rank_objects=False).objects.get(
            "tensor_parallel_layout"
        )
        layout = {k: (int(v[0]), int(v[1])) for k, v in (saved_layout or {}).items()}
        state: ShardedStateDict = tp_reshard.read_resharded(
            ckpt,
            load_dir,
            tag,
            meta,
            layout=layout or tp_reshard.layout_of(engine.module),
            shapes={n: logical_place(p)[0] for n, p in engine.module.named_parameters()},
            tp_size=tp_size,
            tp_index=mesh.index("tp") if mesh is not None else 0,
            make_requests=make_requests,
        )
        regroup(state.objects, engine._group_origin)
        return state
    suffix = tp_suffix(engine)
    if not suffix:
        return ckpt.load(load_dir, tag, make_requests(meta), rank_objects=True)
    # This rank's keys, and the unsuffixed ones every TP rank shares (stacked expert rows).
    shared = tp_reshard.unsuffixed(meta)
    meta = {
        k.removesuffix(suffix): v for k, v in meta.items() if k.endswith(suffix) or k in shared
    }
    requests = [
        LoadRequest(r.name if r.name in shared else r.name + suffix, r.offset, r.numel)
        for r in make_requests(meta)
    ]
    state = ckpt.load(load_dir, tag, requests, rank_objects=True)
    state.tensors = _renamed(state.tensors, lambda k: k.removesuffix(suffix))
    return state
