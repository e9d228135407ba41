"""Per-parameter shard state for ZeRO stage 3.

Each parameter is sharded on its own (not packed into flat buckets): its flattened data is padded
to a multiple of the data-parallel world size and rank ``r`` keeps elements
``[r * shard_numel, (r + 1) * shard_numel)``. Per-parameter shards make the unit of gathering the
unit of use (a module's own parameters), let ``ds.zero.Init`` partition each tensor the moment it
is created, and map one-to-one onto checkpoint tensors so that resharding to another world size
is a matter of element ranges. Coalescing several parameters into one collective is done at
gather/reduce time instead (see ``collectives.py``), so the per-parameter layout costs no extra
collectives.
"""

from __future__ import annotations

import enum
import itertools
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

_ids = itertools.count()


class ParamStatus(enum.Enum):
    NOT_AVAILABLE = "not_available"  # only this rank's shard is resident
    INFLIGHT = "inflight"  # an asynchronous gather is running
    AVAILABLE = "available"  # full data resident in ``param.data``


# DeepSpeed's names for a shard's state, kept on the parameter itself where libraries read them
# (``p.ds_status``, ``p.ds_tensor``, ``p.ds_persist``): field -> attribute.
_MIRRORED = {"status": "ds_status", "shard": "ds_tensor", "persistent": "ds_persist"}


@dataclass(eq=False)
class ShardState:
    """Everything stage 3 knows about one parameter; stored as ``param.ds_shard``."""

    ds_id: int
    shape: torch.Size
    dtype: torch.dtype
    numel: int
    world: int
    rank: int
    shard: torch.Tensor  # (shard_numel,) this rank's slice, padded with zeros at the end
    name: str = ""
    persistent: bool = False  # small parameter kept whole on every rank
    status: ParamStatus = ParamStatus.NOT_AVAILABLE
    pending: Any = None  # the in-flight gather this parameter's data comes from
    grad: torch.Tensor | None = None  # (shard_numel,) fp32 reduced gradient partition
    swapped: bool = False  # shard lives on NVMe; ``shard`` is empty until swapped in
    extra: dict[str, Any] = field(default_factory=dict)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        attr = _MIRRORED.get(name)
        ref = self.__dict__.get("_param") if attr is not None else None
        param = ref() if ref is not None else None
        if param is not None:
            setattr(param, attr, value)

    def bind(self, param: torch.Tensor) -> None:
        """Make ``param`` the parameter this state describes (``param.ds_shard``) and give it
        DeepSpeed's attributes, which follow the state from now on."""
        param.ds_shard = self  # type: ignore[attr-defined]
        object.__setattr__(self, "_param", weakref.ref(param))
        param.ds_id, param.ds_numel, param.ds_shape = self.ds_id, self.numel, self.shape  # type: ignore[attr-defined]
        for name, attr in _MIRRORED.items():
            setattr(param, attr, getattr(self, name))

    @property
    def shard_numel(self) -> int:
        return -(-self.numel // self.world)

    @property
    def padded_numel(self) -> int:
        return self.shard_numel * self.world

    @property
    def offset(self) -> int:
        """First flattened element of the full tensor that this rank's shard holds."""
        return self.rank * self.shard_numel

    @property
    def valid_numel(self) -> int:
        """How many of this rank's shard elements are real (the rest is padding)."""
        return max(0, min(self.shard_numel, self.numel - self.offset))

    @property
    def full_bytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @property
    def shard_bytes(self) -> int:
        return self.shard_numel * self.dtype.itemsize


def shard_of(param: torch.Tensor) -> ShardState:
    state = getattr(param, "ds_shard", None)
    if state is None:
        raise AttributeError(
            f"parameter of shape {tuple(param.shape)} is not partitioned by ZeRO stage 3; "
            "build the module under ds.zero.Init() or hand it to the stage-3 engine first"
        )
    return state  # type: ignore[no-any-return]


def is_partitioned(param: torch.Tensor) -> bool:
    return getattr(param, "ds_shard", None) is not None


def empty_like_param(state: ShardState, device: torch.device) -> torch.Tensor:
    return torch.empty(0, dtype=state.dtype, device=device)


def partition_param(
    param: torch.nn.Parameter,
    rank: int,
    world: int,
    persistence_threshold: int = 0,
    *,
    shard_device: torch.device | str | None = None,
    device: torch.device | str | None = None,
) -> ShardState:
    """Cut ``param`` into its stage-3 shard for ``rank`` and drop the full data (unless small).

    ``shard_device``: where the shard lives (the host under ``offload_param``); ``device``: the
    compute device, where the parameter's (empty or, when persistent, whole) data stays. Both
    default to the parameter's own device. Parameters on the ``meta`` device get an
    uninitialised shard: their values come from a later load (the ``from_pretrained`` pattern)
    through :class:`ds.zero.GatheredParameters`.
    """
    existing = getattr(param, "ds_shard", None)
    if existing is not None:
        return existing  # type: ignore[no-any-return]
    data = param.data
    numel = data.numel()
    shard_numel = -(-numel // world)
    own = torch.device("cpu") if data.device.type == "meta" else data.device
    device = own if device is None else torch.device(device)
    home = device if shard_device is None else torch.device(shard_device)
    shard = torch.zeros(shard_numel, dtype=data.dtype, device=home)
    if data.device.type != "meta":
        flat = data.reshape(-1)
        lo = rank * shard_numel
        hi = min(numel, lo + shard_numel)
        if hi > lo:
            shard[: hi - lo].copy_(flat[lo:hi])  # an explicit copy when the devices differ
    state = ShardState(
        ds_id=next(_ids),
        shape=data.shape,
        dtype=data.dtype,
        numel=numel,
        world=world,
        rank=rank,
        shard=shard,
        persistent=numel <= persistence_threshold,
    )
    if data.device.type == "meta":
        # A meta tensor cannot take CPU data in place: the caller swaps in ``meta_replacement``.
        state.extra["meta"] = True
        state.extra["device"] = device
        return state
    state.bind(param)
    if state.persistent:
        state.status = ParamStatus.AVAILABLE
        if data.device != device:
            param.data = data.to(device)
    else:
        param.data = empty_like_param(state, device)
    return state


def meta_replacement(param: torch.nn.Parameter, state: ShardState) -> torch.nn.Parameter:
    """A real (empty) parameter carrying ``state``, to stand in for a ``meta`` parameter."""
    new = torch.nn.Parameter(
        torch.empty(0, dtype=state.dtype, device=state.extra.get("device", state.shard.device)),
        requires_grad=param.requires_grad,
    )
    state.bind(new)
    return new


def partition_params(
    module: torch.nn.Module, collectives: Any, persistence_threshold: int
) -> list[torch.nn.Parameter]:
    """Partition every parameter of ``module`` (each once) over ``collectives``' ranks, for a
    stage-3 engine; ConfigError for a meta parameter no ``zero.Init`` sharded, or one sharded for
    another world size."""
    from ds.interfaces.errors import ConfigError

    params: list[torch.nn.Parameter] = []
    seen: set[int] = set()
    for name, p in module.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        s = partition_param(p, collectives.rank, collectives.world, persistence_threshold)
        if s.extra.get("meta") and not hasattr(p, "ds_shard"):
            raise ConfigError(
                f"parameter {name} is on the meta device; build the model under "
                "`with torch.device('meta'), ds.zero.Init():` so its shards exist, then load "
                "weights with ds.zero.init.load_state_dict_into_shards"
            )
        if s.world != collectives.world:
            raise ConfigError(
                f"parameter {name} was partitioned for world size {s.world} but the engine "
                f"runs at world size {collectives.world}; build the model under ds.zero.Init "
                "with the same data-parallel group as the engine"
            )
        s.persistent = s.numel <= persistence_threshold
        s.name = name
        s.extra["coll"] = collectives
        params.append(p)
    return params
