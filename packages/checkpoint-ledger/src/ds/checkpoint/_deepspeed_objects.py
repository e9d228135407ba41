"""The engine objects of a DeepSpeed checkpoint as ds's engines load them: step counters, the
LR scheduler, the loss scaler, optimizer groups and the client state (every model-states key that
is not DeepSpeed's own)."""

from __future__ import annotations

from typing import Any

from ds.checkpoint.deepspeed_layout import _attr

# Keys of DeepSpeed's model-states dict that are its own; anything else is the client state.
_ENGINE_KEYS = frozenset(
    {
        "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
        "shared_params", "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd",
        "sparse_tensor_module_names", "skipped_steps", "global_steps", "global_samples",
        "dp_world_size", "mp_world_size", "ds_config", "ds_version", "universal_checkpoint_info",
        "ds_deepcompile_info", "compiled_autograd", "zenflow", "ds_world_size",
        "checkpoint_parallel_dimensions",
    }
)  # fmt: skip
_GROUP_KEYS = ("lr", "betas", "eps", "weight_decay", "momentum", "dampening", "nesterov")


def engine_objects(ck: Any) -> dict[str, Any]:
    """The engine's objects ds loads (step counters, LR scheduler, loss scaler, optimizer
    groups, client state) from DeepSpeed's model states and first optimizer partition."""
    ms = ck.model_states
    steps = int(ms.get("global_steps") or 0)
    cfg = ck.ds_config
    gas = cfg.get("gradient_accumulation_steps")
    if not isinstance(gas, int):
        tbs, mbs = cfg.get("train_batch_size"), cfg.get("train_micro_batch_size_per_gpu")
        gas = tbs // (mbs * ck.world_size) if isinstance(tbs, int) and isinstance(mbs, int) else 1
    groups = getattr(ck, "_groups", [])
    steps_per_group = getattr(ck, "_steps", [])
    scalar_state = []
    for i in range(max(len(groups), 1)):
        s = steps_per_group[i] if i < len(steps_per_group) else None
        s = steps if s is None else s
        scalar_state.append({"step": int(float(s))})
    objects: dict[str, Any] = {
        "step": steps,
        "global_steps": steps,
        "global_samples": int(ms.get("global_samples") or 0),
        "micro_steps": steps * max(int(gas or 1), 1),
        "skipped_steps": int(ms.get("skipped_steps") or 0),
        "lr_scheduler": ms.get("lr_scheduler"),
        "client_state": {k: v for k, v in ms.items() if k not in _ENGINE_KEYS},
        "world_size": ck.world_size,
        "zero_stage": ck.stage,
        "ds_config": cfg,
        "optimizer.param_groups": [
            {k: (tuple(v) if k == "betas" else v) for k, v in g.items() if k in _GROUP_KEYS}
            for g in groups
        ],
        "optimizer.scalar_state": scalar_state,
        "stage3.step_count": int(scalar_state[0]["step"]) if scalar_state else steps,
        "saved_by": f"DeepSpeed {ms.get('ds_version', '?')}",
    }
    scaler = _loss_scaler(ck)
    if scaler is not None:
        objects["loss_scaler"] = scaler
    return objects


def _loss_scaler(ck: Any) -> dict[str, Any] | None:
    if ck.optim_files:
        ls = ck._optim(0).get("loss_scaler")
    else:  # stage 0: DeepSpeed's FP16 optimizers keep the scale in their own state dict
        ls = ck.model_states.get("optimizer")
        ls = ls if _attr(ls, "cur_scale") is not None else None
    if ls is None:
        return None
    out: dict[str, Any] = {"cur_scale": float(_attr(ls, "cur_scale", 1.0))}
    for src, dst in (("cur_hysteresis", "cur_hysteresis"), ("cur_iter", "cur_iter"),
                     ("last_overflow_iter", "last_overflow_iter")):  # fmt: skip
        v = _attr(ls, src)
        if v is not None:
            out[dst] = int(v)
    return out
