"""Stage-3 state as checkpoint tensors, in the names every ZeRO stage uses.

Per-parameter shards map directly onto element ranges of the logical tensors: rank ``r`` holds
``[r * shard_numel, r * shard_numel + valid)`` of ``module.<name>`` (model-dtype weights),
``master.<name>`` (fp32 weights, only when the model is not fp32) and ``optim.<key>.<name>``
(optimizer moments). Frozen parameters (in no optimizer group) are ``frozen.<name>``, this
rank's range of the model-dtype weights, as DeepSpeed keeps them apart. Loading asks for this
rank's range of each, whatever world size or stage wrote the checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch

from ds.interfaces.checkpoint import LoadRequest, ShardedStateDict, ShardedTensor, TensorMeta
from ds.interfaces.errors import CheckpointError
from ds.interfaces.logging import get_logger
from ds.zero.stage3.optimizer import Stage3Optimizer
from ds.zero.stage3.shard import ParamStatus, shard_of
from ds.zero.state_codec import decode as _decode
from ds.zero.state_codec import dtype_name as _dtype
from ds.zero.state_codec import encode as _encode

_MOMENTS = ("exp_avg", "exp_avg_sq")
log = get_logger(__name__)


def _host(t: torch.Tensor) -> torch.Tensor:
    """A host copy for the checkpoint (device tensors too: checkpoints are written from host)."""
    return t.detach().to("cpu", copy=True)


def master_partition(opt: Stage3Optimizer, s: Any) -> torch.Tensor:
    """This rank's fp32 master partition (read back from NVMe when it lives there)."""
    m = opt._masters[s.ds_id].data
    if m.numel() == s.shard_numel:
        return m
    if opt._swap is not None:
        buf = torch.empty(s.shard_numel, dtype=torch.float32)
        opt._swap.read((s.ds_id, "m"), buf)
        return buf
    raise CheckpointError(f"no master partition for {s.name}")


def _frozen(opt: Stage3Optimizer) -> list[Any]:
    """Shards of the parameters no optimizer group holds (requires_grad=False ones)."""
    trained = {id(p) for _, originals in opt._hyper_groups for p in originals}
    return [shard_of(p) for p in opt.part.params if id(p) not in trained]


def _shard_data(part: Any, s: Any) -> torch.Tensor:
    if s.swapped and part.swapper is not None:
        part.swapper.swap_in(s)
        data = s.shard.clone()
        part.swapper.drop(s)
        return data
    return s.shard  # type: ignore[no-any-return]


def save_state(opt: Stage3Optimizer) -> ShardedStateDict:
    out = ShardedStateDict()
    part = opt.part
    for s in _frozen(opt):
        out.tensors[f"frozen.{s.name}"] = ShardedTensor(
            TensorMeta(f"frozen.{s.name}", tuple(s.shape), _dtype(s.dtype)),
            s.offset,
            _host(_shard_data(part, s)[: s.valid_numel]),
        )
    scalar_state: list[dict[str, Any]] = []
    for _group, originals in opt._hyper_groups:
        scalars: dict[str, Any] = {}
        for p in originals:
            s = shard_of(p)
            n = s.valid_numel
            shape = tuple(s.shape)
            master = master_partition(opt, s)
            name = s.name
            shard = _shard_data(part, s)
            out.tensors[f"module.{name}"] = ShardedTensor(
                TensorMeta(f"module.{name}", shape, _dtype(s.dtype)),
                s.offset,
                _host(shard[:n]),
            )
            if s.dtype != torch.float32:
                out.tensors[f"master.{name}"] = ShardedTensor(
                    TensorMeta(f"master.{name}", shape, "float32"), s.offset, _host(master[:n])
                )
            moments = opt.moments(s)
            if moments is not None:
                for key, t in zip(_MOMENTS, moments):
                    out.tensors[f"optim.{key}.{name}"] = ShardedTensor(
                        TensorMeta(f"optim.{key}.{name}", shape, _dtype(t.dtype)),
                        s.offset,
                        _host(t[:n]),
                    )
            if not scalars:
                st = opt.optimizer.state.get(opt._masters[s.ds_id], {})
                scalars = {k: _encode(v) for k, v in st.items() if k not in _MOMENTS}
        if not scalars and opt.step_count:
            scalars = {"step": _encode(torch.tensor(float(opt.step_count)))}
        scalar_state.append(scalars)
    out.objects["optimizer.param_groups"] = [
        {k: v for k, v in g.items() if k != "params"} for g in opt.optimizer.param_groups
    ]
    out.objects["optimizer.scalar_state"] = scalar_state
    out.objects["stage3.step_count"] = opt.step_count
    return out


def load_requests(opt: Stage3Optimizer, metadata: dict[str, TensorMeta]) -> list[LoadRequest]:
    reqs: list[LoadRequest] = []
    frozen = {s.ds_id for s in _frozen(opt)}
    for p in opt.part.params:
        s = shard_of(p)
        n = s.valid_numel
        if n == 0:
            continue
        if s.ds_id in frozen:
            if f"frozen.{s.name}" in metadata:
                reqs.append(LoadRequest(f"frozen.{s.name}", s.offset, n))
            else:  # saved without them (exclude_frozen_parameters): they keep their values
                missing_frozen(s.name)
            continue
        src = f"master.{s.name}" if f"master.{s.name}" in metadata else f"module.{s.name}"
        if src not in metadata:
            raise CheckpointError(
                f"checkpoint has no weights for parameter {s.name!r}; was it saved from a "
                "different model?"
            )
        reqs.append(LoadRequest(src, s.offset, n))
        for key in _MOMENTS:
            if f"optim.{key}.{s.name}" in metadata:
                reqs.append(LoadRequest(f"optim.{key}.{s.name}", s.offset, n))
    return reqs


def missing_frozen(name: str) -> None:
    log.warning("checkpoint holds no frozen parameter; it keeps its current values", parameter=name)


def _take(shard: ShardedTensor, offset: int, numel: int) -> torch.Tensor:
    start = offset - shard.offset
    return shard.local.reshape(-1)[start : start + numel]


def load_state(opt: Stage3Optimizer, state: ShardedStateDict) -> None:
    part = opt.part
    saved_groups = state.objects.get("optimizer.param_groups") or []
    scalar_state = state.objects.get("optimizer.scalar_state") or []
    step = int(state.objects.get("stage3.step_count", 0))
    if not step and scalar_state and "step" in scalar_state[0]:
        step = int(float(_decode(scalar_state[0]["step"])))
    opt.step_count = step
    for gi, (group, originals) in enumerate(opt._hyper_groups):
        if gi < len(saved_groups):
            group.update(saved_groups[gi])
        scalars = (
            {k: _decode(v) for k, v in scalar_state[gi].items()} if gi < len(scalar_state) else {}
        )
        for p in originals:
            s = shard_of(p)
            n = s.valid_numel
            src = state.tensors.get(f"master.{s.name}") or state.tensors.get(f"module.{s.name}")
            if src is None and n:
                raise CheckpointError(f"checkpoint has no weights for parameter {s.name!r}")
            full = torch.zeros(s.shard_numel, dtype=torch.float32)
            if n:
                assert src is not None
                full[:n].copy_(_take(src, s.offset, n))
            moments = []
            for key in _MOMENTS:
                t = state.tensors.get(f"optim.{key}.{s.name}")
                buf = torch.zeros(s.shard_numel, dtype=torch.float32)
                if t is not None and n:
                    buf[:n].copy_(_take(t, s.offset, n))
                moments.append(buf if t is not None else None)
            opt.restore(s, full, moments, scalars)
    for s in _frozen(opt):
        t = state.tensors.get(f"frozen.{s.name}")
        if t is not None and s.valid_numel:
            data = torch.zeros(s.shard_numel, dtype=s.dtype)
            data[: s.valid_numel].copy_(_take(t, s.offset, s.valid_numel))
            opt._write_back(s, data)
    for p in part.params:
        s = shard_of(p)
        if s.status is ParamStatus.AVAILABLE and not s.persistent:
            part.release([p])
    part.refresh_persistent()
