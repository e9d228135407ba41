"""Writing a ds checkpoint tag in DeepSpeed 0.19.8's layout, so DeepSpeed loads it.

``write_deepspeed(src_dir, dst_dir, zero_stage=2, world_size=4)`` reads one ds tag (its logical
tensors ``module.<p>``, ``master.<p>``, ``optim.<state>.<p>``, ``frozen.<p>``, ``buffer.<b>`` and
its objects) and writes what DeepSpeed's engine saves for the same model at that ZeRO stage and
data-parallel size: ``mp_rank_00_model_states.pt`` (whole weights, parameter shapes, counters, LR
scheduler, client state) and one ``[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt`` per rank
(that rank's slice of each group's flat fp32 master vector and of the Adam moments), then
``latest``; at stage 0 the whole optimizer state goes into the model states instead. DeepSpeed's ``engine.load_checkpoint`` resumes from it at that world size, and its
``zero_to_fp32.py`` and universal-checkpoint converter read it.

DeepSpeed's flat layout depends on parameter order: each optimizer group's trainable parameters,
in the order the group lists them, are concatenated and padded to a multiple of ``2 * world``;
rank ``r`` owns the ``r``-th equal slice. The order comes from ``param_groups`` (names per group),
else ``model`` (one group: its trainable parameters in ``named_parameters()`` order, what
DeepSpeed builds when ``deepspeed.initialize`` gets no ``model_parameters``), else the order the
tag recorded (``optimizer.group_params``, written by ds since this converter exists).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ds.checkpoint._deepspeed_pickle import FragmentAddress, save, zero_stage
from ds.interfaces.errors import CheckpointError

DEEPSPEED_VERSION = "0.19.8"
_ALIGN = 2  # DeepSpeed's nccl_start_alignment_factor: flat groups pad to 2 * world elements
_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
           "bfloat16": torch.bfloat16}  # fmt: skip
SUPPORTED = "ds writes DeepSpeed ZeRO stage 0-2 checkpoints in fp32 or bf16 with Adam/AdamW"
# What torch's Adam/AdamW groups hold besides ds's recorded hyperparameters (DeepSpeed saves the
# torch optimizer's groups; torch fills missing keys with Adam's defaults, not AdamW's).
_TORCH_ADAM_GROUP = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                     "differentiable": False, "fused": None}  # fmt: skip


def _refuse(what: str) -> CheckpointError:
    return CheckpointError(f"cannot write a DeepSpeed checkpoint: {what}; {SUPPORTED}")


class _Source:
    """One ds tag, read whole (every logical tensor) through ds's checkpoint engine."""

    def __init__(self, directory: str, tag: str | None) -> None:
        from ds.checkpoint.deepspeed_format import is_deepspeed_checkpoint
        from ds.checkpoint.engine import ShardedCheckpointEngine
        from ds.checkpoint.pipeline_format import pipeline_root
        from ds.checkpoint.sharding import full_requests

        if is_deepspeed_checkpoint(directory, tag):
            raise CheckpointError(f"{directory} is already a DeepSpeed checkpoint")
        if pipeline_root(directory, tag) is not None:
            raise _refuse("pipeline-parallel checkpoints are not converted")
        eng = ShardedCheckpointEngine()
        self.tag = tag or eng.latest_tag(directory)
        if self.tag is None:
            raise CheckpointError(f"no checkpoint tag in {directory}")
        metas = eng.metadata(directory, self.tag)
        state = eng.load(directory, self.tag, full_requests(metas.values()))
        self.tensors = {n: t.local.reshape(tuple(metas[n].shape)) for n, t in state.tensors.items()}
        self.objects: dict[str, Any] = dict(state.objects)

    def params(self) -> list[str]:
        return [n[len("module.") :] for n in self.tensors if n.startswith("module.")]

    def dtype(self) -> torch.dtype:
        found = {t.dtype for n, t in self.tensors.items() if n.startswith("module.")}
        return found.pop() if len(found) == 1 else torch.float32

    def master(self, name: str) -> torch.Tensor:
        t = self.tensors.get(f"master.{name}", self.tensors[f"module.{name}"])
        return t.float()


def _check_source(src: _Source) -> None:
    objs = src.objects
    tp = int(objs.get("tensor_parallel_size") or 1)
    if tp > 1 or any("@tp" in n for n in src.tensors):
        raise _refuse(f"the tag was saved with tensor parallelism (size {tp})")
    if objs.get("ds_autoep_layers") or objs.get("autoep_layers"):
        raise _refuse("mixture-of-experts (expert-parallel) layouts are not converted")
    origin = list(objs.get("optimizer.group_origin") or [])
    if origin and origin != list(range(len(origin))):
        raise _refuse("the engine split the optimizer groups (expert or tensor-parallel replicas)")
    keys = {n.split(".")[1] for n in src.tensors if n.startswith("optim.")}
    if not keys <= {"exp_avg", "exp_avg_sq"}:
        raise _refuse(f"optimizer state {sorted(keys)} is not Adam's (exp_avg, exp_avg_sq)")


def _groups(
    src: _Source, model: torch.nn.Module | None, param_groups: Sequence[Sequence[str]] | None
) -> list[list[str]]:
    saved_groups = src.objects.get("optimizer.param_groups") or [{}]
    if param_groups is not None:
        groups = [list(g) for g in param_groups]
    elif model is not None:
        if len(saved_groups) > 1:
            raise CheckpointError(
                f"the tag has {len(saved_groups)} optimizer groups; pass param_groups (the "
                "parameter names of each group, in the order given to the optimizer)"
            )
        groups = [[n for n, p in model.named_parameters() if p.requires_grad and p.numel()]]
    elif src.objects.get("optimizer.group_params"):
        groups = [list(g) for g in src.objects["optimizer.group_params"]]
    else:
        raise CheckpointError(
            "this ds tag records no parameter order (saved by an older ds); pass the model "
            "(write_deepspeed(..., model=...)) or the names per group (--param-order FILE)"
        )
    groups = [[n for n in g if f"module.{n}" in src.tensors] for g in groups]
    named = [n for g in groups for n in g]
    missing = sorted(set(src.params()) - set(named))
    if missing or len(named) != len(set(named)):
        raise CheckpointError(
            f"the parameter order given does not cover the tag's trainable parameters once each "
            f"(missing: {missing[:5]})"
        )
    if len(groups) != len(saved_groups):
        raise CheckpointError(
            f"{len(groups)} parameter groups given; the tag's optimizer has {len(saved_groups)}"
        )
    return groups


def _flat(tensors: list[torch.Tensor], world: int) -> torch.Tensor:
    flat = torch.cat([t.reshape(-1) for t in tensors])
    align = _ALIGN * world
    padded = -(-flat.numel() // align) * align
    return torch.cat([flat, flat.new_zeros(padded - flat.numel())])


def _torch_group(saved: Mapping[str, Any], indices: list[int]) -> dict[str, Any]:
    group = dict(_TORCH_ADAM_GROUP)
    group.update({k: v for k, v in saved.items() if k != "params"})
    group["betas"] = tuple(group.get("betas", (0.9, 0.999)))
    group["decoupled_weight_decay"] = bool(saved.get("adamw_mode", True))
    group["params"] = indices
    return group


def _stage0_optimizer(src: _Source, groups: list[list[str]], dtype: torch.dtype) -> dict[str, Any]:
    """Stage 0 keeps the optimizer whole in the model states: the torch optimizer's state dict
    (parameters numbered across groups) or, in bf16, DeepSpeed's wrapper holding it beside the
    fp32 masters of every parameter."""
    saved_groups = src.objects.get("optimizer.param_groups") or [{}]
    scalar = src.objects.get("optimizer.scalar_state") or [{}]
    state: dict[int, Any] = {}
    torch_groups = []
    for gi, names in enumerate(groups):
        first = len(state)
        step = (scalar[gi] if gi < len(scalar) else scalar[0]).get("step", 0)
        for i, n in enumerate(names, start=first):
            state[i] = {"step": torch.tensor(float(step))}
            for key in ("exp_avg", "exp_avg_sq"):
                if f"optim.{key}.{n}" in src.tensors:
                    state[i][key] = src.tensors[f"optim.{key}.{n}"].float().clone()
        saved = saved_groups[gi] if gi < len(saved_groups) else saved_groups[0]
        torch_groups.append(_torch_group(saved, list(range(first, len(state)))))
    torch_sd = {"state": state, "param_groups": torch_groups}
    if dtype == torch.float32:
        return torch_sd
    steps = int(src.objects.get("global_steps") or 0)
    return {"dynamic_loss_scale": False, "cur_scale": 1.0, "cur_iter": steps,
            "optimizer_state_dict": torch_sd,
            "fp32_groups": [[src.master(n) for n in names] for names in groups]}  # fmt: skip


def _optim_states(
    src: _Source, groups: list[list[str]], world: int, stage: int
) -> list[dict[str, Any]]:
    """Each rank's ZeRO 1/2 optimizer state dict, as DeepSpeed's stage_1_and_2 optimizer saves it
    (rigid form: the torch optimizer's state over this rank's flat partition, padding included;
    the fp32 partition with the padding cut off)."""
    saved_groups = src.objects.get("optimizer.param_groups") or [{}]
    scalar = src.objects.get("optimizer.scalar_state") or [{}]
    clip = float((src.objects.get("ds_config") or {}).get("gradient_clipping") or 0.0)
    out = []
    flats = []
    for names in groups:
        shapes = [src.tensors[f"module.{n}"].shape for n in names]
        per = {"fp32": _flat([src.master(n) for n in names], world)}
        for key in ("exp_avg", "exp_avg_sq"):
            if all(f"optim.{key}.{n}" in src.tensors for n in names):
                per[key] = _flat([src.tensors[f"optim.{key}.{n}"].float() for n in names], world)
        numel = sum(s.numel() for s in shapes)
        flats.append((names, shapes, numel, per))
    for r in range(world):
        fp32, state, torch_groups, paddings, mappings = [], {}, [], [], []
        for gi, (names, shapes, numel, per) in enumerate(flats):
            part = per["fp32"].numel() // world
            lo, hi = r * part, (r + 1) * part
            pad = hi - max(lo, min(hi, numel))
            fp32.append(per["fp32"][lo : hi - pad].clone())
            step = (scalar[gi] if gi < len(scalar) else scalar[0]).get("step", 0)
            st: dict[str, Any] = {"step": torch.tensor(float(step))}
            st.update({k: v[lo:hi].clone() for k, v in per.items() if k != "fp32"})
            state[gi] = st
            saved = saved_groups[gi] if gi < len(saved_groups) else saved_groups[0]
            torch_groups.append(_torch_group(saved, [gi]))
            paddings.append(pad)
            mapping: OrderedDict[str, Any] = OrderedDict()
            offset = 0
            for n, shape in zip(names, shapes, strict=True):
                a, b = max(offset, lo), min(offset + shape.numel(), hi)
                if a < b:
                    mapping[n] = FragmentAddress(numel=b - a, start=a - lo)
                offset += shape.numel()
            mappings.append(mapping)
        out.append(
            {
                "dynamic_loss_scale": False,
                "overflow": False,
                "clip_grad": clip,
                "base_optimizer_state": {"state": state, "param_groups": torch_groups},
                "single_partition_of_fp32_groups": fp32,
                "zero_stage": zero_stage(stage),
                "group_paddings": paddings,
                "param_alignment_paddings": [[0] * len(f[0]) for f in flats],
                "partition_count": [world] * len(flats),
                "ds_version": DEEPSPEED_VERSION,
                "param_slice_mappings": mappings,
            }
        )
    return out


def _unset(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` without its unset (None) keys: ds records every field, a DeepSpeed config only
    those the user set, and DeepSpeed's tools read a key that is present as set."""
    return {k: _unset(v) if isinstance(v, Mapping) else v for k, v in cfg.items() if v is not None}


def _config(src: _Source, stage: int, dtype: torch.dtype) -> dict[str, Any]:
    """The tag's ds config with the stage and precision written."""
    cfg = _unset(src.objects.get("ds_config") or {})
    cfg["zero_optimization"] = dict(cfg.get("zero_optimization") or {}, stage=stage)
    cfg["bf16"] = dict(cfg.get("bf16") or {}, enabled=dtype == torch.bfloat16)
    cfg["fp16"] = dict(cfg.get("fp16") or {}, enabled=False)
    return cfg


def _model_states(
    src: _Source,
    groups: list[list[str]],
    model: torch.nn.Module | None,
    stage: int,
    world: int,
    dtype: torch.dtype,
) -> dict[str, Any]:
    """``mp_rank_00_model_states.pt``: what DeepSpeed's engine saves beside the partitions."""

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype) if t.is_floating_point() and src.dtype() != dtype else t

    weights = {n: src.tensors[f"module.{n}"] for g in groups for n in g}
    if src.dtype() != dtype:
        weights = {n: src.master(n).to(dtype) for n in weights}
    frozen = {
        n[len("frozen.") :]: cast(t) for n, t in src.tensors.items() if n.startswith("frozen.")
    }
    buffers = {
        n[len("buffer.") :]: cast(t) for n, t in src.tensors.items() if n.startswith("buffer.")
    }
    if model is not None:  # the model's own state_dict order, persistent buffers only
        everything = {**buffers, **frozen, **weights}
        keys = list(model.state_dict().keys())
        absent = [k for k in keys if k not in everything]
        if absent:
            raise CheckpointError(f"the tag lacks the model's {absent[:5]}")
        module = OrderedDict((k, everything[k]) for k in keys)
        buffer_names = [k for k in keys if k in buffers]
    else:
        module = OrderedDict({**weights, **frozen, **buffers})
        buffer_names = list(buffers)
    objs = src.objects
    keep_frozen = stage >= 2  # DeepSpeed records frozen parameters apart when it partitions grads
    states: dict[str, Any] = {
        "module": module,
        "buffer_names": buffer_names,
        "optimizer": _stage0_optimizer(src, groups, dtype) if stage == 0 else None,
        "param_shapes": [OrderedDict((n, weights[n].shape) for n in g) for g in groups]
        if stage else None,
        "frozen_param_shapes": OrderedDict((n, t.shape) for n, t in frozen.items())
        if keep_frozen else None,
        "shared_params": {} if stage else None,
        "frozen_param_fragments": OrderedDict(frozen) if keep_frozen else None,
        "lr_scheduler": objs.get("lr_scheduler"),
        "data_sampler": None,
        "random_ltd": None,
        "skipped_steps": int(objs.get("skipped_steps") or 0),
        "global_steps": int(objs.get("global_steps") or objs.get("step") or 0),
        "global_samples": int(objs.get("global_samples") or 0),
        "dp_world_size": world,
        "mp_world_size": 1,
        "checkpoint_parallel_dimensions": {"pp_degree": 1, "tp_degree": 1},
        "ds_config": _config(src, stage, dtype),
        "ds_version": DEEPSPEED_VERSION,
    }  # fmt: skip
    client = dict(objs.get("client_state") or {})
    clash = sorted(set(client) & set(states))
    if clash:
        raise CheckpointError(f"the tag's client state uses DeepSpeed's own keys {clash}")
    states.update(client)
    return states


def write_deepspeed(
    src_dir: str,
    dst_dir: str,
    *,
    tag: str | None = None,
    out_tag: str | None = None,
    zero_stage: int | None = None,
    world_size: int = 1,
    dtype: str | torch.dtype | None = None,
    model: torch.nn.Module | None = None,
    param_groups: Sequence[Sequence[str]] | None = None,
) -> str:
    """Write ds tag ``tag`` of ``src_dir`` (default: the one ``latest`` names) as a DeepSpeed
    checkpoint in ``dst_dir`` for ``deepspeed.initialize`` at ZeRO ``zero_stage`` (default: the
    tag's, if 1 or 2) and data-parallel size ``world_size``; ``dtype`` "fp32" or "bf16" (default:
    the tag's). Returns the tag folder written."""
    src = _Source(src_dir, tag)
    _check_source(src)
    saved_stage = int(src.objects.get("zero_stage") or 0)
    stage = saved_stage if zero_stage is None else int(zero_stage)
    if stage not in (0, 1, 2):
        raise _refuse(f"ZeRO stage {stage} is not written; pass --zero-stage 0, 1 or 2")
    if stage == 0 and any(n.startswith("frozen.") for n in src.tensors):
        raise _refuse("stage 0 with frozen parameters (DeepSpeed numbers them in its optimizer)")
    if world_size < 1:
        raise CheckpointError(f"world size must be at least 1, not {world_size}")
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise _refuse(f"dtype {dtype!r} is not written")
        dtype = _DTYPES[dtype]
    target = dtype or src.dtype()
    if target not in (torch.float32, torch.bfloat16):
        raise _refuse(f"the tag is {str(target).removeprefix('torch.')} (fp16 loss-scaler state)")
    groups = _groups(src, model, param_groups)
    out_tag = out_tag or src.tag
    path = os.path.join(dst_dir, out_tag)
    os.makedirs(path, exist_ok=True)
    for name in os.listdir(path):  # a previous conversion's files (other ranks, other dtype)
        if name.endswith(("_optim_states.pt", "_model_states.pt")):
            os.remove(os.path.join(path, name))
    prefix = "bf16_" if target == torch.bfloat16 else ""
    cfg = _config(src, stage, target)
    for r, sd in enumerate(_optim_states(src, groups, world_size, stage) if stage else []):
        zero = {"optimizer_state_dict": sd, "ds_config": cfg, "ds_version": DEEPSPEED_VERSION}
        save(zero, os.path.join(path, f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
    states = _model_states(src, groups, model, stage, world_size, target)
    save(states, os.path.join(path, "mp_rank_00_model_states.pt"))
    with open(os.path.join(dst_dir, "latest"), "w", encoding="utf-8") as f:
        f.write(out_tag)
    return path
