"""``engine.offload_states()`` / ``engine.reload_states()``: DeepSpeed's API for handing the
accelerator's memory to something else between training phases (RLHF: train, then generate),
moving optimizer states, fp32 masters, gradients and low-precision parameters to host memory and
back.

Training state is shared: module parameters are views of flat buffers, masters may be views of
them, gradients views of a flat gradient buffer, optimizer state is keyed by the master tensors.
So a storage is moved, not a tensor: every tensor the engine holds that views a selected storage
(found by walking the strategy, the optimizer and the module's parameters) is re-pointed, with
its own offset, shape and stride, at one host copy of that storage (``tensor.data = ...``, so the
objects, and the optimizer state keyed by them, stay the same), and on reload at one new device
copy. Once every holder is re-pointed nothing references the device storage and the allocator
frees it. On a CPU-only run the move is a copy within host memory with the same bookkeeping.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Iterable, Iterator
from enum import Enum
from typing import Any

import torch

from ds.interfaces.errors import ConfigError, DsError
from ds.interfaces.logging import get_logger

log = get_logger(__name__)


class OffloadStateTypeEnum(str, Enum):
    """What ``offload_states(include=...)`` moves (DeepSpeed's names)."""

    optim_states = "optim_states"
    hp_params = "hp_params"
    lp_params = "lp_params"
    lp_grads = "lp_grads"
    contiguous_grad_buffer = "contiguous_grad_buffer"


class OffloadDeviceEnum(str, Enum):
    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class StatesOffloadedError(DsError, RuntimeError):
    """The engine was used while its states were on the host."""


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _tensors(v)


def _walk(roots: Iterable[Any]) -> list[torch.Tensor]:
    """Every tensor reachable from ``roots`` through ds.zero objects, dataclasses and containers
    (not through modules, communicators or kernel providers: parameters are added explicitly)."""
    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, str | bytes | int | float | bool):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found[id(obj)] = obj
            if obj.is_leaf and obj.grad is not None:
                stack.append(obj.grad)
            stack.extend(vars(obj).values())  # ds attributes on parameters (stage-3 shards)
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif isinstance(obj, torch.nn.Module):
            continue
        elif isinstance(obj, torch.optim.Optimizer) or type(obj).__module__.startswith("ds.zero"):
            if dataclasses.is_dataclass(obj):
                stack.extend(getattr(obj, f.name) for f in dataclasses.fields(obj))
            stack.extend(getattr(obj, "__dict__", {}).values())
    return list(found.values())


def _by_type(engine: Any) -> dict[str, list[torch.Tensor]]:
    """The tensors each state type names, at every stage."""
    strategy, opt = engine.strategy, engine.optimizer
    params = [p for p in engine.module.parameters() if p.requires_grad]
    out: dict[str, list[torch.Tensor]] = {
        "optim_states": list(_tensors(list(opt.state.values()))),
        "hp_params": [p for g in opt.param_groups for p in g["params"]],
        "lp_params": list(params),
        "lp_grads": [p.grad for p in params if p.grad is not None],
        "contiguous_grad_buffer": [],
    }
    for g in getattr(strategy, "groups", []):  # stages 0-2: flat buffers
        out["lp_params"].append(g.flat.flat)
        if g.flat_grad is not None:
            out["lp_grads"].append(g.flat_grad)
        out["contiguous_grad_buffer"].append(g.master_grad)
        out["contiguous_grad_buffer"] += [b.buffer for b in g.buckets if b.buffer is not None]
    partitioner = getattr(strategy, "partitioner", None)
    if partitioner is not None:  # stage 3: each rank's partitions and their gradients
        for p in partitioner.params:
            shard = getattr(p, "ds_shard", None)
            if shard is None:
                continue
            out["lp_params"].append(shard.shard)
            if shard.grad is not None:
                out["lp_grads"].append(shard.grad)
        out["lp_grads"] += list(strategy.opt._host_grads.values())
    return out


def _key(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


def _view(storage: torch.UntypedStorage, like: torch.Tensor) -> torch.Tensor:
    out = torch.empty(0, dtype=like.dtype, device=storage.device)
    return out.set_(storage, like.storage_offset(), like.size(), like.stride())


@dataclasses.dataclass
class _Moved:
    device: torch.device
    host: torch.UntypedStorage
    holders: list[torch.Tensor]


class StateOffloader:
    """The engine's record of what is on the host."""

    def __init__(self) -> None:
        self.moved: list[_Moved] = []
        self.types: set[str] = set()
        self._guard: Any = None

    @property
    def active(self) -> bool:
        return bool(self.types)

    def offload(
        self,
        engine: Any,
        include: Container[Any] | None,
        device: Any,
        pin_memory: bool,
        non_blocking: bool,
    ) -> None:
        types = _check(engine, include, device)
        if not types:
            return
        selected = _by_type(engine)
        storages: dict[int, torch.UntypedStorage] = {}
        for name in types:
            for t in selected[name]:
                st = t.untyped_storage()
                if st.nbytes() and _key(t) not in storages:
                    storages[_key(t)] = st
        holders: dict[int, list[torch.Tensor]] = {k: [] for k in storages}
        roots = [engine.strategy, engine.optimizer, *engine.module.parameters()]
        for t in _walk(roots):
            if t.untyped_storage().nbytes() and _key(t) in holders:
                holders[_key(t)].append(t)
        with torch.no_grad():
            for key, st in storages.items():
                pin = pin_memory and st.device.type != "cpu"
                host = torch.empty(st.nbytes(), dtype=torch.uint8, pin_memory=pin)
                host.copy_(_view(st, torch.empty(st.nbytes(), dtype=torch.uint8)), non_blocking)
                hs = host.untyped_storage()
                for t in holders[key]:
                    t.data = _view(hs, t)
                self.moved.append(_Moved(st.device, hs, holders[key]))
        self.types |= types
        if self._guard is None:
            self._guard = engine.module.register_forward_pre_hook(_refuse_forward)
        log.info("states offloaded", types=sorted(types), storages=len(storages))

    def reload(self, non_blocking: bool) -> None:
        with torch.no_grad():
            for moved in self.moved:
                n = moved.host.nbytes()
                dev = torch.empty(n, dtype=torch.uint8, device=moved.device)
                dev.copy_(_view(moved.host, torch.empty(n, dtype=torch.uint8)), non_blocking)
                ds = dev.untyped_storage()
                for t in moved.holders:
                    t.data = _view(ds, t)
        self.moved.clear()
        self.types.clear()
        if self._guard is not None:
            self._guard.remove()
            self._guard = None


def _refuse_forward(module: Any, args: Any) -> None:
    raise StatesOffloadedError(
        "the engine's states are offloaded (engine.offload_states()); call "
        "engine.reload_states() before the next forward"
    )


def _check(engine: Any, include: Container[Any] | None, device: Any) -> set[str]:
    zero = engine.config.zero
    if zero.offload_optimizer_device != "none" or zero.offload_param_device != "none":
        raise ConfigError(
            "offload_states() moves device-resident states; with zero_optimization."
            "offload_optimizer/offload_param set they already live on the host: remove the call "
            "or the offload section"
        )
    where = str(getattr(device, "value", device))
    if where == "none":
        log.warning("offload_states(device='none'): nothing to do")
        return set()
    if where != "cpu":
        raise ConfigError(
            f"offload_states(device={where!r}) is not supported (DeepSpeed refuses it too); "
            "use device=OffloadDeviceEnum.cpu"
        )
    names = [t.value for t in OffloadStateTypeEnum]
    if include is None:
        return set(names)
    given = (
        {str(getattr(t, "value", t)) for t in include} if isinstance(include, Iterable) else set()
    )
    unknown = sorted(given - set(names))
    if unknown:
        raise ConfigError(
            f"offload_states(include=...) got {unknown}; use OffloadStateTypeEnum members: "
            f"{', '.join(names)}"
        )
    return {n for n in names if OffloadStateTypeEnum(n) in include}
