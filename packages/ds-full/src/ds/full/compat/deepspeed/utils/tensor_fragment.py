"""``deepspeed.utils.tensor_fragment``: reading and writing one parameter's fp32 master and
optimizer state through the engine that trains it (``safe_set_full_fp32_param``,
``safe_get_full_optimizer_state``, ``safe_set_full_optimizer_state``, ``safe_get_local_*``).

ds keeps the masters of ZeRO stages 0-2 in flat fp32 partitions (one per parameter group, this
rank's ``[lo, hi)`` of the group's flat buffer) and those of stage 3 per parameter partition;
the optimizer's state is keyed by those masters. A parameter's piece is found through the engines
``deepspeed.initialize`` made (weakly held). The ``full`` functions take and return whole tensors
and must be called on every data-parallel rank with the same value (the getters all-reduce the
ranks' pieces when the world is larger than one); the ``local`` ones return this rank's piece,
flattened, as DeepSpeed's do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from typing import Any

import torch

from ds.full.compat.deepspeed._missing import FeatureNotAvailableError

_ENGINES: weakref.WeakSet[Any] = weakref.WeakSet()


def register_engine(engine: Any) -> None:
    """Remember an engine so its parameters' masters can be found (weakly)."""
    with contextlib.suppress(TypeError):  # not weak-referenceable: not found later
        _ENGINES.add(engine)


def _strategy(engine: Any) -> Any:
    for holder in (engine, getattr(engine, "engine", None), getattr(engine, "module_engine", None)):
        strategy = getattr(holder, "strategy", None)
        if strategy is not None:
            return strategy
    return None


@dataclasses.dataclass
class _Piece:
    """Where a parameter's values live in the optimizer: ``master`` (fp32, 1-D) holds flat
    elements ``[start, stop)`` of the parameter, at ``master[m0:m0 + stop - start]``."""

    strategy: Any
    master: torch.Tensor
    m0: int
    start: int
    stop: int
    comm: Any
    group: Any
    world: int
    grad: torch.Tensor | None = None  # the reduced gradient laid out as ``master``, if any

    @property
    def local(self) -> torch.Tensor:
        return self.master.data[self.m0 : self.m0 + self.stop - self.start]


def _piece(param: torch.nn.Parameter, what: str) -> _Piece:
    for engine in list(_ENGINES):
        strategy = _strategy(engine)
        if strategy is None:
            continue
        for group in getattr(strategy, "groups", ()):
            fg = group.flat
            for i, p in enumerate(fg.params):
                if p is param:
                    off = fg.offsets[i]
                    a, b = max(off, group.lo), min(off + p.numel(), group.hi)
                    b = max(a, b)
                    return _Piece(
                        strategy, group.master, a - group.lo, a - off, b - off,
                        getattr(strategy, "comm", None),
                        group.replica_pg if group.replica_pg is not None else strategy.ctx.group,
                        fg.world_size, group.master_grad,
                    )  # fmt: skip
        opt = getattr(strategy, "opt", None)
        if hasattr(param, "ds_shard") and opt is not None and hasattr(opt, "_masters"):
            from ds.zero.stage3.shard import shard_of

            s = shard_of(param)
            master = opt._masters.get(s.ds_id)
            if master is None:
                continue
            coll = strategy.partitioner.coll
            return _Piece(
                strategy, master, 0, s.offset, s.offset + s.valid_numel,
                coll.comm, coll.group, coll.world, s.grad,
            )  # fmt: skip
    raise FeatureNotAvailableError(
        f"deepspeed.utils.{what}: the parameter is not trained by an engine that "
        "deepspeed.initialize made (or it is frozen), so it has no fp32 master or optimizer state"
    )


def _shape(param: torch.nn.Parameter) -> torch.Size:
    if hasattr(param, "ds_shard"):
        from ds.zero.stage3.shard import shard_of

        return torch.Size(shard_of(param).shape)
    return param.shape


def _full(piece: _Piece, param: torch.nn.Parameter, local: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(_shape(param).numel(), dtype=local.dtype, device=local.device)
    out[piece.start : piece.stop].copy_(local)
    if piece.world > 1 and piece.comm is not None:
        piece.comm.all_reduce(out, group=piece.group)
    return out.view(_shape(param))


def _state(piece: _Piece, key: str, what: str) -> torch.Tensor:
    state = piece.strategy.optimizer.state.get(piece.master)
    if not state or key not in state:
        have = sorted(state) if state else []
        raise KeyError(f"deepspeed.utils.{what}: no optimizer state {key!r} (have {have})")
    value = state[key]
    if not isinstance(value, torch.Tensor) or value.numel() != piece.master.numel():
        raise FeatureNotAvailableError(
            f"deepspeed.utils.{what}: optimizer state {key!r} is not kept per element"
        )
    return value.reshape(-1)[piece.m0 : piece.m0 + piece.stop - piece.start]


def safe_get_full_fp32_param(param: torch.nn.Parameter) -> torch.Tensor:
    """The whole fp32 master of ``param`` (collective over the data-parallel ranks). A parameter
    no engine trains reads as its own value (gathered under ZeRO-3's ``zero.Init``)."""
    try:
        piece = _piece(param, "safe_get_full_fp32_param")
    except FeatureNotAvailableError:
        import ds.zero

        with ds.zero.GatheredParameters([param]):
            return param.detach().float().clone()
    return _full(piece, param, piece.local.float())


def partitioned_full_grad(param: torch.nn.Parameter) -> torch.Tensor | None:
    """The whole gradient of ``param`` from the engine's reduced partitions (ZeRO 2-3), after
    backward and before step: averaged over the data-parallel ranks and, with fp16, still
    multiplied by the loss scale (as the optimizer will see it). None before any backward.
    Collective over the data-parallel ranks."""
    piece = _piece(param, "safe_get_full_grad")
    if piece.grad is None:
        return None
    local = piece.grad[piece.m0 : piece.m0 + piece.stop - piece.start]
    return _full(piece, param, local.float())


def safe_get_local_grad(param: torch.nn.Parameter) -> torch.Tensor | None:
    """This rank's piece of ``param``'s reduced gradient, flattened, after backward and before
    step: fp32 (the accumulation dtype) and, with fp16, still multiplied by the loss scale.
    None before any backward."""
    piece = _piece(param, "safe_get_local_grad")
    if piece.grad is None:
        return None
    return piece.grad[piece.m0 : piece.m0 + piece.stop - piece.start].detach().clone()


def safe_set_local_grad(param: torch.nn.Parameter, value: torch.Tensor) -> None:
    """Replace this rank's piece of ``param``'s reduced gradient (what the next step reads,
    norm and clipping included) with ``value``, shaped as :func:`safe_get_local_grad` returns."""
    piece = _piece(param, "safe_set_local_grad")
    n = piece.stop - piece.start
    flat = value.detach().reshape(-1)
    if piece.grad is None:
        raise FeatureNotAvailableError(
            "deepspeed.utils.safe_set_local_grad: the parameter has no gradient yet; call it "
            "after backward and before step"
        )
    if flat.numel() != n:
        raise ValueError(
            f"safe_set_local_grad: value has {flat.numel()} elements, this rank's piece {n}"
        )
    with torch.no_grad():
        piece.grad[piece.m0 : piece.m0 + n].copy_(flat)


def safe_set_full_fp32_param(param: torch.nn.Parameter, value: torch.Tensor) -> None:
    """Set the whole fp32 master of ``param`` (and the parameter itself) to ``value``; every
    data-parallel rank passes the same value."""
    piece = _piece(param, "safe_set_full_fp32_param")
    flat = value.detach().reshape(-1).to(torch.float32)
    if flat.numel() != _shape(param).numel():
        raise ValueError(
            f"safe_set_full_fp32_param: value has {flat.numel()} elements, the parameter "
            f"{tuple(_shape(param))}"
        )
    with torch.no_grad():
        if hasattr(param, "ds_shard"):
            from ds.zero.init import write_shard
            from ds.zero.stage3.shard import shard_of

            write_shard(shard_of(param), flat.to(piece.master.device))  # shard and master
            piece.local.copy_(flat[piece.start : piece.stop])
        else:
            param.data.copy_(flat.view(param.shape).to(param.dtype))
            piece.local.copy_(flat[piece.start : piece.stop])


def safe_get_full_optimizer_state(param: torch.nn.Parameter, optim_state_key: str) -> torch.Tensor:
    """The whole optimizer state ``optim_state_key`` (``exp_avg``, ...) of ``param``."""
    piece = _piece(param, "safe_get_full_optimizer_state")
    local = _state(piece, optim_state_key, "safe_get_full_optimizer_state")
    return _full(piece, param, local.float())


def safe_set_full_optimizer_state(
    param: torch.nn.Parameter, value: torch.Tensor, optim_state_key: str
) -> None:
    """Set the whole optimizer state ``optim_state_key`` of ``param`` to ``value``."""
    piece = _piece(param, "safe_set_full_optimizer_state")
    local = _state(piece, optim_state_key, "safe_set_full_optimizer_state")
    flat = value.detach().reshape(-1)
    with torch.no_grad():
        local.copy_(flat[piece.start : piece.stop])


def safe_get_local_fp32_param(param: torch.nn.Parameter) -> torch.Tensor:
    """This rank's piece of ``param``'s fp32 master, flattened."""
    return _piece(param, "safe_get_local_fp32_param").local.detach().clone()


def safe_set_local_fp32_param(param: torch.nn.Parameter, value: torch.Tensor) -> None:
    """Set this rank's piece of ``param``'s fp32 master (the parameter follows at the next
    step, when ZeRO copies the masters back)."""
    piece = _piece(param, "safe_set_local_fp32_param")
    with torch.no_grad():
        piece.local.copy_(value.detach().reshape(-1))


def safe_get_local_optimizer_state(param: torch.nn.Parameter, optim_state_key: str) -> torch.Tensor:
    piece = _piece(param, "safe_get_local_optimizer_state")
    return _state(piece, optim_state_key, "safe_get_local_optimizer_state").detach().clone()


def safe_set_local_optimizer_state(
    param: torch.nn.Parameter, value: torch.Tensor, optim_state_key: str
) -> None:
    piece = _piece(param, "safe_set_local_optimizer_state")
    local = _state(piece, optim_state_key, "safe_set_local_optimizer_state")
    with torch.no_grad():
        local.copy_(value.detach().reshape(-1))
