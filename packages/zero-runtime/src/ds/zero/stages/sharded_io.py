"""Checkpoint state of stages 0-2: this rank's partition as ranges of logical tensors.

Names follow :mod:`ds.zero.stages.base`: ``module.<param>`` (model-dtype weights),
``master.<param>`` (fp32 weights when they differ from the module's) and
``optim.<state>.<param>`` (optimizer moments), each the element range this rank owns; scalars
(step counts) travel as objects (:mod:`ds.zero.state_codec`). Tensors handed to the checkpoint
engine are host copies; loaded values are copied explicitly onto the state's device.

An expert parameter that is this rank's rows of a stacked tensor (:class:`ExpertSlice`) is saved
as those rows of the logical tensor: its keys carry the whole shape and its ranges start at the
slice's element offset, so every expert-parallel rank's rows land in one tensor and a load at
another expert-parallel size reads its own rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ds.interfaces.checkpoint import LoadRequest, ShardedStateDict, ShardedTensor, TensorMeta
from ds.interfaces.errors import CheckpointError
from ds.interfaces.moe import expert_slice
from ds.zero.stages.groups import Group
from ds.zero.state_codec import decode, dtype_name, encode


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


def logical_place(param: torch.Tensor) -> tuple[tuple[int, ...], int]:
    """The shape of the logical tensor ``param`` is saved in and where its elements start."""
    sl = expert_slice(param)
    if sl is None:
        return tuple(param.shape), 0
    return tuple(sl.full_shape), sl.element_offset


def sharded_moments(optimizer: torch.optim.Optimizer, group: Group) -> dict[str, torch.Tensor]:
    state = optimizer.state.get(group.master, {})
    return {
        k: v
        for k, v in state.items()
        if isinstance(v, torch.Tensor) and v.numel() == group.master.numel() and v.dim() == 1
    }


def state_dict(groups: list[Group], optimizer: torch.optim.Optimizer) -> ShardedStateDict:
    out = ShardedStateDict()
    scalar_state: list[dict[str, Any]] = []
    for group in groups:
        fg = group.flat
        start, stop = fg.partition_range()
        sharded = sharded_moments(optimizer, group)
        for seg in fg.segments(start, stop):
            name = fg.names[seg.index]
            shape, base = logical_place(fg.params[seg.index])
            offset = base + seg.param_offset
            sl = slice(seg.flat_offset, seg.flat_offset + seg.numel)
            ml = slice(seg.flat_offset - group.lo, seg.flat_offset - group.lo + seg.numel)
            pieces = [(f"module.{name}", fg.flat[sl])]
            if not (group.master_is_view or fg.dtype == torch.float32):
                pieces.append((f"master.{name}", group.master[ml]))
            pieces += [(f"optim.{key}.{name}", value[ml]) for key, value in sharded.items()]
            for key, t in pieces:
                out.tensors[key] = ShardedTensor(
                    TensorMeta(key, shape, dtype_name(t.dtype)), offset, _host(t)
                )
        state = optimizer.state.get(group.master, {})
        scalar_state.append({k: encode(v) for k, v in state.items() if k not in sharded})
    out.objects["optimizer.param_groups"] = [
        {k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups
    ]
    out.objects["optimizer.scalar_state"] = scalar_state
    return out


def load_requests(groups: list[Group], metadata: dict[str, TensorMeta]) -> list[LoadRequest]:
    reqs: list[LoadRequest] = []
    for group in groups:
        fg = group.flat
        for seg in fg.segments(group.lo, group.hi):
            name = fg.names[seg.index]
            offset = logical_place(fg.params[seg.index])[1] + seg.param_offset
            src = f"master.{name}" if f"master.{name}" in metadata else f"module.{name}"
            if src not in metadata:
                raise _missing(name)
            reqs.append(LoadRequest(src, offset, seg.numel))
            prefix, suffix = "optim.", f".{name}"
            for key in metadata:
                if key.startswith(prefix) and key.endswith(suffix):
                    state_key = key[len(prefix) : -len(suffix)]
                    if "." not in state_key:
                        reqs.append(LoadRequest(key, offset, seg.numel))
    return reqs


def load_state_dict(
    groups: list[Group],
    optimizer: torch.optim.Optimizer,
    state: ShardedStateDict,
    regather: Callable[[Group], None] | None,
) -> None:
    """Restore each group's partition; ``regather`` refreshes the module's other partitions."""
    scalar_state = state.objects.get("optimizer.scalar_state") or []
    saved_groups = state.objects.get("optimizer.param_groups") or []
    for gi, group in enumerate(groups):
        fg = group.flat
        moments: dict[str, torch.Tensor] = {}
        for seg in fg.segments(group.lo, group.hi):
            name = fg.names[seg.index]
            offset = logical_place(fg.params[seg.index])[1] + seg.param_offset
            ml = slice(seg.flat_offset - group.lo, seg.flat_offset - group.lo + seg.numel)
            src = state.tensors.get(f"master.{name}") or state.tensors.get(f"module.{name}")
            if src is None:
                raise _missing(name)
            with torch.no_grad():
                group.master[ml].copy_(_range(src, offset, seg.numel))
            prefix, suffix = "optim.", f".{name}"
            for key, shard in state.tensors.items():
                if key.startswith(prefix) and key.endswith(suffix):
                    state_key = key[len(prefix) : -len(suffix)]
                    if "." in state_key:
                        continue
                    buf = moments.get(state_key)
                    if buf is None:
                        buf = torch.zeros(
                            group.master.numel(),
                            dtype=shard.local.dtype,
                            device=group.master.device,
                        )
                        moments[state_key] = buf
                    buf[ml].copy_(_range(shard, offset, seg.numel))
        restored: dict[str, Any] = dict(moments)
        if gi < len(scalar_state):
            restored.update({k: decode(v) for k, v in scalar_state[gi].items()})
        if restored:
            optimizer.state[group.master] = restored
        if gi < len(saved_groups):
            optimizer.param_groups[gi].update(saved_groups[gi])
        with torch.no_grad():
            if not group.master_is_view:
                fg.flat[group.lo : group.hi].copy_(group.master)
        if regather is not None:
            regather(group)


def _range(shard: ShardedTensor, offset: int, numel: int) -> torch.Tensor:
    # Checkpoint engines return exactly the requested range; accept a wider one too.
    start = offset - shard.offset
    return shard.local.reshape(-1)[start : start + numel]


def _missing(name: str) -> Exception:
    return CheckpointError(
        f"checkpoint has no weights for parameter {name!r}; was it saved from a different model?"
    )
