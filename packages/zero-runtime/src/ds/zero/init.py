"""``ds.zero.Init``: build a module with its parameters partitioned as they are created, and
``GatheredParameters``: temporarily whole parameters for reading or editing.

Init wraps every ``nn.Module`` subclass's ``__init__`` while the context is open; when the outermost
``__init__`` of a module returns, that module's own parameters are cut into this rank's shards and
their full data dropped, so at most one module's parameters are ever whole during construction.
Modules built on the ``meta`` device get empty shards, filled later by
:func:`load_state_dict_into_shards` (the ``from_pretrained`` pattern: build on meta, then load).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import torch

from ds.interfaces.comm import Communicator
from ds.interfaces.errors import ConfigError
from ds.zero.stage3.collectives import Collectives
from ds.zero.stage3.linear import zero3_linear
from ds.zero.stage3.shard import ParamStatus, meta_replacement, partition_param, shard_of


def _default_comm() -> Communicator | None:
    from ds.interfaces.registry import get, has_provider

    # ds.comm's current communicator (a simulated world routes through its own), else torch's.
    name = "current" if has_provider("ds.comm_backends", "current") else "torch"
    if not has_provider("ds.comm_backends", name):
        return None
    comm: Communicator = get("ds.comm_backends", name)()
    return comm if comm.is_initialized() else None


def _default_device() -> torch.device:
    """The rank's device from the registered accelerator (``DS_ACCELERATOR``, else cuda when
    torch sees one, else cpu; the same choice as ``ds.full.initialize``); cpu when none is
    registered."""
    from ds.interfaces.registry import get, has_provider

    name = os.environ.get("DS_ACCELERATOR") or ("cuda" if torch.cuda.is_available() else "cpu")
    if not has_provider("ds.accelerators", name):
        return torch.device("cpu")
    return torch.device(get("ds.accelerators", name)().current_device_name())


def single_rank_group_contradiction(
    dp_world_size: int, explicit_group: Any, env: Mapping[str, Any] | None = None
) -> str | None:
    """Why partitioning over a one-rank group is a mistake here, or None when it is not.

    A launcher that started several processes sets ``WORLD_SIZE``; if ``Init`` nevertheless
    finds a one-rank group (no process group yet, or a one-rank one set up by a library before
    ``init_distributed``) and the caller named no group, every rank would build the whole model
    unpartitioned and most likely run out of memory long after the real mistake. An explicitly
    given one-rank group is taken as intended.
    """
    if dp_world_size != 1 or explicit_group is not None:
        return None
    env = os.environ if env is None else env
    try:
        launched = int(env.get("WORLD_SIZE") or 0)
    except (TypeError, ValueError):
        return None
    if launched <= 1:
        return None
    return (
        f"zero.Init found a data-parallel group of 1 rank but the launcher set WORLD_SIZE="
        f"{launched}: every rank would build the whole model unpartitioned. Call "
        "init_distributed() (ds.comm.init_distributed / deepspeed.init_distributed) before "
        "building the model under zero.Init, or pass data_parallel_group= if one rank is meant"
    )


def _subclasses(cls: type) -> list[type]:
    out, todo = [], [cls]
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(c.__subclasses__())
    return list(dict.fromkeys(out))


class Init:
    """Context manager: modules constructed inside are partitioned across data-parallel ranks.

    ``comm``/``group``: the data-parallel communicator and group (default: the registered
    ``torch`` communicator when its process group is up, else a single rank). ``dtype`` casts
    floating-point parameters before partitioning. ``param_persistence_threshold``: parameters with
    at most this many elements stay whole on every rank (default 0 here; the engine applies its
    configured threshold). ``config_dict_or_path`` is accepted for compatibility and read for
    ``zero_optimization.stage3_param_persistence_threshold`` and ``offload_param.device`` when
    given as a dict.

    ``device``: the rank's compute device (default: the registered accelerator's current device,
    which the launcher and ``ds.full`` set from the local rank). Each parameter is moved there
    before rank 0's values are broadcast (NCCL moves device tensors only) and its shard stays
    there, unless ``remote_device`` is ``"cpu"`` or ``"nvme"`` (DeepSpeed's argument; also
    taken from ``offload_param.device``): then shards live on the host.
    """

    #: The ``torch.nn.functional.linear`` the first :func:`use_memory_efficient_linear` replaced.
    linear_bk: ClassVar[Any]

    def __init__(
        self,
        module: torch.nn.Module | None = None,
        data_parallel_group: Any = None,
        config_dict_or_path: Mapping[str, Any] | str | None = None,
        remote_device: str | None = None,
        pin_memory: bool = False,
        *,
        device: torch.device | str | None = None,
        comm: Communicator | None = None,
        dtype: torch.dtype | None = None,
        param_persistence_threshold: int | None = None,
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled
        self.comm = comm if comm is not None else (_default_comm() if enabled else None)
        zero: Mapping[str, Any] = {}
        if isinstance(config_dict_or_path, Mapping):
            zero = config_dict_or_path.get("zero_optimization", {}) or {}
        if param_persistence_threshold is None:
            param_persistence_threshold = zero.get(
                "stage3_param_persistence_threshold", zero.get("param_persistence_threshold", 0)
            )
        if remote_device is None:
            remote_device = (zero.get("offload_param") or {}).get("device")
        self.device = torch.device(device) if device is not None else _default_device()
        offloaded = remote_device in ("cpu", "nvme")
        self.shard_device = torch.device("cpu") if offloaded else self.device
        # Pinned host shards make the fetch copies asynchronous; only a real CUDA runtime pins.
        self.pin_memory = bool(pin_memory) and offloaded and torch.cuda.is_available()
        self.coll = Collectives(self.comm, data_parallel_group, device=self.device)
        if enabled and comm is None:
            why = single_rank_group_contradiction(self.coll.world, data_parallel_group)
            if why is not None:
                raise ConfigError(why)
        self.dtype = dtype
        self.memory_efficient_linear = bool(zero.get("memory_efficient_linear", True))
        self.threshold = int(param_persistence_threshold or 0)
        self._patched: list[tuple[type, Any]] = []
        self._replaced: dict[int, torch.nn.Parameter] = {}
        self._keep: list[torch.nn.Parameter] = []
        self._orig_init_subclass: Any = None
        if module is not None and enabled:
            if self.memory_efficient_linear:
                use_memory_efficient_linear()
            self.partition_module(module)

    def _src(self) -> int:
        """Global rank of the data-parallel group's first rank (broadcast takes global ranks)."""
        group = self.coll.group
        if group is None or self.coll.comm is None:
            return 0
        return int(self.coll.comm.get_global_rank(group, 0))

    # -- partitioning --------------------------------------------------------------------------
    def partition_module(self, module: torch.nn.Module) -> None:
        """Partition an already built module (``Init(module=m)`` form)."""
        for m in module.modules():
            self._partition_own(m)

    def _partition_own(self, m: torch.nn.Module) -> None:
        for name, p in list(m._parameters.items()):
            if p is None or hasattr(p, "ds_shard"):
                continue
            if id(p) in self._replaced:  # a meta parameter shared with an earlier module
                m._parameters[name] = self._replaced[id(p)]
                continue
            if self.dtype is not None and p.is_floating_point():
                p.data = p.data.to(self.dtype)
            if p.device.type != "meta" and p.device != self.device:
                p.data = p.data.to(self.device)  # one module's parameters whole at a time
            if self.coll.world > 1 and p.device.type != "meta" and self.coll.comm is not None:
                # Rank 0's initialisation wins (as in DDP), whatever each rank's RNG produced.
                self.coll.comm.broadcast(p.data, src=self._src(), group=self.coll.group)
            s = partition_param(
                p,
                self.coll.rank,
                self.coll.world,
                self.threshold,
                shard_device=self.shard_device,
                device=self.device,
            )
            if self.pin_memory and s.shard.device.type == "cpu":
                s.shard = s.shard.pin_memory()
            s.extra["coll"] = self.coll
            if s.extra.get("meta"):
                new = meta_replacement(p, s)
                self._replaced[id(p)] = new
                self._keep.append(p)  # keeps id(p) unique while the mapping lives
                m._parameters[name] = new

    def _wrap(self, cls: type) -> None:
        if "__init__" not in cls.__dict__ or getattr(cls.__init__, "_ds_init_wrapped", False):
            return
        orig = cls.__dict__["__init__"]
        ctx = self

        @functools.wraps(orig)
        def wrapped(module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
            depth = module.__dict__.get("_ds_init_depth", 0)
            object.__setattr__(module, "_ds_init_depth", depth + 1)
            try:
                orig(module, *args, **kwargs)
            finally:
                object.__setattr__(module, "_ds_init_depth", depth)
            if depth == 0:
                del module.__dict__["_ds_init_depth"]
                ctx._partition_own(module)

        wrapped._ds_init_wrapped = True  # type: ignore[attr-defined]
        self._patched.append((cls, orig))
        cls.__init__ = wrapped  # type: ignore[misc]

    def __enter__(self) -> Init:
        if not self.enabled:
            return self
        if self.memory_efficient_linear:
            use_memory_efficient_linear()
        for cls in _subclasses(torch.nn.Module):
            self._wrap(cls)
        ctx = self
        self._orig_init_subclass = torch.nn.Module.__dict__.get("__init_subclass__")

        @classmethod  # type: ignore[misc]
        def init_subclass(cls: type, **kwargs: Any) -> None:
            super(torch.nn.Module, cls).__init_subclass__(**kwargs)
            ctx._wrap(cls)

        torch.nn.Module.__init_subclass__ = init_subclass  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        self._replaced.clear()
        self._keep.clear()
        for cls, orig in reversed(self._patched):
            cls.__init__ = orig  # type: ignore[misc]
        self._patched.clear()
        if self._orig_init_subclass is None:
            del torch.nn.Module.__init_subclass__
        else:
            torch.nn.Module.__init_subclass__ = self._orig_init_subclass  # type: ignore[misc]


def use_memory_efficient_linear() -> None:
    """Route ``torch.nn.functional.linear`` through stage 3's
    :func:`~ds.zero.stage3.linear.zero3_linear` for the rest of the process, as DeepSpeed's
    ``zero.Init`` and stage-3 engine do under ``zero_optimization.memory_efficient_linear`` (the
    default): a module calling ``F.linear`` on a partitioned weight then frees it after forward
    too (calls without autograd run torch's own linear). Idempotent; the function replaced first is kept as
    ``Init.linear_bk``; a wrapper around ``zero3_linear`` (its ``__wrapped__``) stays in place."""
    current = torch.nn.functional.linear
    if current is zero3_linear or getattr(current, "__wrapped__", None) is zero3_linear:
        return
    if "linear_bk" not in Init.__dict__:
        Init.linear_bk = current
    torch.nn.functional.linear = zero3_linear


def _coll_of(p: torch.Tensor) -> Collectives:
    coll = shard_of(p).extra.get("coll")
    if coll is None:
        coll = Collectives(None)
    return coll  # type: ignore[no-any-return]


class GatheredParameters:
    """Make partitioned parameters whole inside the block; with ``modifier_rank`` set, that rank's
    edits are broadcast and written back into every rank's shard on exit.

    Every rank must enter the block (it gathers). Parameters that are not partitioned are passed
    through untouched, so the same code runs with and without stage 3.
    """

    def __init__(
        self,
        params: torch.nn.Parameter | Iterable[torch.nn.Parameter],
        modifier_rank: int | None = None,
        fwd_module: torch.nn.Module | None = None,
        enabled: bool = True,
    ) -> None:
        if isinstance(params, torch.Tensor):
            params = [params]  # type: ignore[list-item]
        self.params = [p for p in params if hasattr(p, "ds_shard")] if enabled else []
        self.modifier_rank = modifier_rank
        self._gathered: list[torch.nn.Parameter] = []

    def __enter__(self) -> None:
        todo = [p for p in self.params if shard_of(p).status is not ParamStatus.AVAILABLE]
        for p in todo:
            s = shard_of(p)
            if s.pending is not None:
                s.pending.wait()
                continue
            swapper = s.extra.get("swapper") if s.swapped else None
            if swapper is not None:
                swapper.swap_in(s)
            _coll_of(p).gather([p]).wait()
            if swapper is not None:
                swapper.drop(s)
            self._gathered.append(p)

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self.modifier_rank is not None and exc_type is None:
            for p in self.params:
                self._write_back(p)
        for p in self._gathered:
            s = shard_of(p)
            if s.persistent:
                continue
            _coll_of(p).release_param(p)  # hands a pooled buffer back
        self._gathered.clear()

    def _write_back(self, p: torch.nn.Parameter) -> None:
        s = shard_of(p)
        coll = _coll_of(p)
        if tuple(p.data.shape) != tuple(s.shape):
            raise ConfigError(
                f"parameter {s.name or s.ds_id} changed shape inside GatheredParameters "
                f"({tuple(s.shape)} -> {tuple(p.data.shape)}); edit values in place instead"
            )
        full = p.data.contiguous()
        if coll.comm is not None and coll.world > 1:
            if self.modifier_rank >= coll.world:  # type: ignore[operator]
                raise ConfigError(
                    f"GatheredParameters(modifier_rank={self.modifier_rank}) but the "
                    f"data-parallel world has {coll.world} ranks"
                )
            coll.comm.broadcast(full, src=self.modifier_rank, group=coll.group)  # type: ignore[arg-type]
        write_shard(s, full)
        if full.data_ptr() != p.data.data_ptr():
            p.data.copy_(full.view(s.shape))


def write_shard(s: Any, full: torch.Tensor) -> None:
    """Copy this rank's slice of a full tensor into the shard (and any fp32 master)."""
    flat = full.reshape(-1)
    n = s.valid_numel
    swapper = s.extra.get("swapper")
    if s.swapped and swapper is not None:  # the shard lives on NVMe: rewrite it there
        shard = torch.zeros(s.shard_numel, dtype=s.dtype)
        shard[:n].copy_(flat[s.offset : s.offset + n])
        swapper.write_back(s, shard)
    elif s.shard.numel() and (n == 0 or s.shard.data_ptr() != flat[s.offset :].data_ptr()):
        s.shard[:n].copy_(flat[s.offset : s.offset + n])
    hook = s.extra.get("on_shard_written")
    if hook is not None:
        hook(s, flat[s.offset : s.offset + n])


def load_state_dict_into_shards(
    module: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True
) -> list[str]:
    """Fill partitioned parameters from a full state dict without gathering: every rank copies
    only its own slice. Returns the names of parameters the dict did not contain (an error when
    ``strict``). Buffers are loaded as usual."""
    missing: list[str] = []
    for name, p in module.named_parameters():
        if name not in state_dict:
            missing.append(name)
            continue
        src = state_dict[name]
        if not hasattr(p, "ds_shard"):
            with torch.no_grad():
                p.copy_(src)
            continue
        s = shard_of(p)
        if tuple(src.shape) != tuple(s.shape):
            raise ConfigError(
                f"state dict entry {name} has shape {tuple(src.shape)} but the parameter is "
                f"{tuple(s.shape)}"
            )
        write_shard(s, src.to(s.dtype))
        if s.status is ParamStatus.AVAILABLE or s.persistent:
            p.data = src.to(dtype=s.dtype, device=_coll_of(p).device_of(s)).clone()
            s.status = ParamStatus.AVAILABLE
    for name, b in module.named_buffers():
        if name in state_dict:
            b.data.copy_(state_dict[name])
    if strict and missing:
        raise ConfigError(f"state dict is missing parameters: {', '.join(missing)}")
    return missing
