"""The module-level, torch.distributed-shaped API of ds.comm.

Every function forwards to one process-wide Communicator (the torch backend unless
:func:`set_communicator` chose another), so ``from ds import comm as dist`` is a drop-in for
``import torch.distributed as dist``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import torch
import torch.distributed as _dist

from ds.comm import quantized as _quantized
from ds.comm._instrument import Tap
from ds.comm.backends.torch_backend import TorchCommunicator
from ds.comm.comms_logger import CommsLogger
from ds.comm.env import DistEnv, discover, free_port
from ds.comm.observe import forwarding
from ds.interfaces.errors import CommError, ConfigError
from ds.interfaces.logging import get_logger

if TYPE_CHECKING:
    from ds.comm.comms_logger_config import CommsLoggerConfig

log = get_logger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_TIMEOUT_S = 1800.0

_comm: Any = TorchCommunicator()


def get_communicator() -> Any:
    """The Communicator every module-level function forwards to."""
    return _comm


def set_communicator(comm: Any) -> None:
    """Route the module-level API through another ``Communicator`` (e.g. a registry plug-in)."""
    global _comm
    _comm = comm


# -- setup ----------------------------------------------------------------------------------------
def _timeout_s(timeout: float | datetime.timedelta | None) -> float:
    if timeout is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _backend(dist_backend: str | None, accelerator: Any) -> str:
    if dist_backend:
        return dist_backend
    if accelerator is not None:
        return str(accelerator.communication_backend_name())
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(
    dist_backend: str | None = None,
    auto_mpi_discovery: bool = True,
    distributed_port: int = 29500,
    verbose: bool = True,
    timeout: float | datetime.timedelta | None = None,
    init_method: str | None = None,
    dist_init_required: bool | None = None,
    config: Mapping[str, Any] | None = None,
    rank: int = -1,
    world_size: int = -1,
    accelerator: Any = None,
) -> DistEnv | None:
    """Initialise the default process group from the environment; a no-op when already done.

    Rank and world size come from ``rank``/``world_size`` when given, else from the environment
    (see :mod:`ds.comm.env`: the ds launcher/torchrun, OpenMPI, MPICH/Intel MPI, SLURM). With no
    distributed environment at all, a single-process group (rank 0 of 1) is created. ``config``
    may carry DeepSpeed-style ``comms_logger`` and ds ``comm`` sections (see :func:`configure`).
    Returns the environment used, or None when the group already existed.
    """
    if dist_init_required is False or _comm.is_initialized():
        if config is not None:
            _configure_from(config)
        _apply_env_switches()
        return None
    if rank >= 0 and world_size > 0:
        found = discover(auto_mpi_discovery=False) if "RANK" in os.environ else None
        addr = os.environ.get("MASTER_ADDR", found.master_addr if found else "127.0.0.1")
        port = int(os.environ.get("MASTER_PORT", distributed_port))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        env = DistEnv(rank, world_size, local, addr, port, "explicit")
    else:
        found = discover(default_port=distributed_port, auto_mpi_discovery=auto_mpi_discovery)
        if found is None:
            if init_method is not None:
                raise ConfigError(
                    f"init_method={init_method!r} needs rank= and world_size= (or RANK and "
                    "WORLD_SIZE in the environment)"
                )
            port = int(os.environ.get("MASTER_PORT", 0)) or free_port()
            found = DistEnv(0, 1, 0, "127.0.0.1", port, "single")
        env = found
    # Export what was found so that env:// rendezvous and later readers agree.
    os.environ.setdefault("RANK", str(env.rank))
    os.environ.setdefault("WORLD_SIZE", str(env.world_size))
    os.environ.setdefault("LOCAL_RANK", str(env.local_rank))
    os.environ.setdefault("MASTER_ADDR", env.master_addr)
    os.environ.setdefault("MASTER_PORT", str(env.master_port))
    backend = _backend(dist_backend, accelerator)
    if verbose:
        log.info(
            "initializing process group",
            backend=backend,
            rank=env.rank,
            world_size=env.world_size,
            source=env.source,
        )
    try:
        _comm.init_process_group(
            backend, init_method or "env://", env.rank, env.world_size, _timeout_s(timeout)
        )
    except (RuntimeError, ValueError) as exc:
        raise CommError(
            f"could not initialise the {backend} process group (rank {env.rank} of "
            f"{env.world_size}, rendezvous {env.master_addr}:{env.master_port}, from "
            f"{env.source}): {exc}"
        ) from exc
    # After the group exists: the watchdog needs its store.
    if config is not None:
        _configure_from(config)
    _apply_env_switches()
    return env


def init_process_group(*args: Any, **kwargs: Any) -> None:
    """torch's own spelling, for drop-in code: forwards to ``torch.distributed`` unchanged (so
    every torch argument works), then applies the DS_COMM_* switches like
    :func:`init_distributed`. Prefer ``init_distributed``, which also discovers the environment."""
    if not _dist.is_initialized():
        _dist.init_process_group(*args, **kwargs)
    _apply_env_switches()


def _apply_env_switches() -> None:
    # DS_COMM_WATCHDOG=<seconds> and DS_COMM_DEBUG=1 switch the hang/consistency guards on for
    # whole test suites and jobs without code changes.
    wd = os.environ.get("DS_COMM_WATCHDOG")
    if wd and wd not in ("0", "false") and _tap_watchdog() is None:
        configure(watchdog=float(wd) if wd.replace(".", "", 1).isdigit() else True)
    if os.environ.get("DS_COMM_DEBUG") in ("1", "true"):
        configure(check_consistency=True)


def _tap_watchdog() -> Any:
    tap = getattr(_comm, "tap", None)
    return tap.watchdog if tap is not None else None


def _configure_from(config: Mapping[str, Any]) -> None:
    section = config.get("comms_logger")
    if section is not None:
        configure(comms_logger=section)
    comm_section = config.get("comm")
    if comm_section is not None:
        unknown = set(comm_section) - {"watchdog", "check_consistency"}
        if unknown:
            raise ConfigError(
                f"unknown key(s) {sorted(unknown)} in the 'comm' config section; "
                "allowed: watchdog, check_consistency"
            )
        configure(
            watchdog=comm_section.get("watchdog"),
            check_consistency=comm_section.get("check_consistency"),
        )


def configure(
    comms_logger: CommsLogger | CommsLoggerConfig | Mapping[str, Any] | bool | None = None,
    watchdog: Any = None,
    check_consistency: bool | None = None,
    event_bus: Any = None,
) -> None:
    """Switch instrumentation on or off; ``None`` leaves a setting as it is.

    ``comms_logger``: a CommsLogger, its config (model or dict) or a bool.
    ``watchdog``: True (300 s), a timeout in seconds, a dict ``{timeout_s, poll_s, warn_after_s}``,
    a Watchdog, or False to switch it off. ``event_bus``: an EventBus that receives a CommEvent per
    collective (False removes it).
    """
    comm = _comm
    if not hasattr(comm, "set_tap"):
        raise CommError(
            f"the active communicator {type(comm).__name__} does not support instrumentation"
        )
    tap = comm.tap if comm.tap is not None else Tap()
    if comms_logger is not None:
        tap.logger = _make_logger(comms_logger)
    if watchdog is not None:
        if tap.watchdog is not None:
            tap.watchdog.stop()
        tap.watchdog = _make_watchdog(watchdog)
    if check_consistency is not None:
        tap.check_consistency = bool(check_consistency)
    if event_bus is not None:
        tap.event_bus = event_bus or None
    comm.set_tap(None if tap.is_idle() else tap)


def _make_logger(spec: Any) -> CommsLogger | None:
    from ds.comm.comms_logger_config import CommsLoggerConfig

    if isinstance(spec, CommsLogger):
        return spec
    if isinstance(spec, bool):
        return CommsLogger(CommsLoggerConfig(enabled=True)) if spec else None
    cfg = spec if isinstance(spec, CommsLoggerConfig) else CommsLoggerConfig(**dict(spec))
    return CommsLogger(cfg) if cfg.enabled else None


def _make_watchdog(spec: Any) -> Any:
    from ds.comm.watchdog import Watchdog

    if isinstance(spec, Watchdog):
        return spec
    if spec is False:
        return None
    if spec is True:
        return Watchdog()
    if isinstance(spec, (int, float)):
        return Watchdog(timeout_s=float(spec))
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"timeout_s", "poll_s", "warn_after_s", "enabled"}
        if unknown:
            raise ConfigError(
                f"unknown watchdog key(s) {sorted(unknown)}; allowed: enabled, timeout_s, "
                "poll_s, warn_after_s"
            )
        if not spec.get("enabled", True):
            return None
        return Watchdog(**{k: v for k, v in spec.items() if k != "enabled"})
    raise ConfigError(f"watchdog={spec!r} is not a bool, seconds, dict or Watchdog")


def get_comms_logger() -> CommsLogger | None:
    tap = getattr(_comm, "tap", None)
    return tap.logger if tap is not None else None


def log_summary(ranks: Sequence[int] = (0,)) -> str:
    """Print the comms logger table on ``ranks`` (rank 0 by default) and return it."""
    lg = get_comms_logger()
    if lg is None:
        raise CommError(
            "the comms logger is off; enable it with ds.comm.configure(comms_logger=True) or "
            'the config section {"comms_logger": {"enabled": true}}'
        )
    rank = _comm.get_rank() if _comm.is_initialized() else 0
    return lg.log_summary(rank=rank, ranks=tuple(ranks))


@contextlib.contextmanager
def collective_timeout(seconds: float) -> Iterator[None]:
    """Bound every collective issued in this block (this thread) by ``seconds``.

    A collective that runs out raises CollectiveTimeoutError; with the watchdog on, the message
    names the ranks that never arrived.
    """
    comm = _comm
    created = comm.tap is None
    tap = comm.tap if not created else Tap()
    if created:
        comm.set_tap(tap)
    prev = tap.timeout_override
    tap.timeout_override = float(seconds)
    try:
        yield
    finally:
        tap.timeout_override = prev
        if created and comm.tap is tap and tap.is_idle():
            comm.set_tap(None)


# -- process groups ---------------------------------------------------------------------------------
def is_available() -> bool:
    return bool(_dist.is_available())


def is_initialized() -> bool:
    return bool(_comm.is_initialized())


def get_rank(group: Any = None) -> int:
    return int(_comm.get_rank(group))


def get_world_size(group: Any = None) -> int:
    return int(_comm.get_world_size(group))


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def get_backend(group: Any = None) -> str:
    return str(_comm.get_backend(group))


def new_group(
    ranks: Sequence[int] | None = None,
    timeout: Any = None,
    backend: str | None = None,
    pg_options: Any = None,
    **kwargs: Any,
) -> Any:
    if timeout is not None:
        kwargs["timeout"] = (
            timeout
            if isinstance(timeout, datetime.timedelta)
            else datetime.timedelta(seconds=timeout)
        )
    if backend is not None:
        kwargs["backend"] = backend
    if pg_options is not None:
        kwargs["pg_options"] = pg_options
    return _comm.new_group(ranks, **kwargs)


def get_process_group_ranks(group: Any = None) -> list[int]:
    return list(_comm.get_process_group_ranks(group))


def get_global_rank(group: Any, group_rank: int) -> int:
    return int(_comm.get_global_rank(group, group_rank))


def destroy_process_group(group: Any = None) -> None:
    _comm.destroy_process_group(group)


# -- collectives ------------------------------------------------------------------------------------
def barrier(
    group: Any = None, async_op: bool = False, device_ids: Any = None, timeout: Any = None
) -> Any:
    if timeout is None and device_ids is None:
        return _comm.barrier(group, async_op)
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    if device_ids is not None:
        return _comm.barrier(group, async_op, timeout=seconds, device_ids=device_ids)
    return _comm.barrier(group, async_op, timeout=seconds)


# The operations that take no more than the communicator does: torch.distributed's signatures
# (as TorchCommunicator spells them), called on whichever communicator is active.
_T = TorchCommunicator


def _forward(method: Callable[Concatenate[Any, P], R]) -> Callable[P, R]:
    return forwarding(method, get_communicator, __name__)


broadcast = _forward(_T.broadcast)
all_reduce = _forward(_T.all_reduce)
inference_all_reduce = all_reduce  # DeepSpeed's name (tensor, op, group), in place
reduce = _forward(_T.reduce)
all_gather = _forward(_T.all_gather)
all_gather_into_tensor = _forward(_T.all_gather_into_tensor)
all_gather_single = all_gather_into_tensor
reduce_scatter = _forward(_T.reduce_scatter)
reduce_scatter_tensor = _forward(_T.reduce_scatter_tensor)
reduce_scatter_single = reduce_scatter_tensor
all_to_all_single = _forward(_T.all_to_all_single)
all_to_all = _forward(_T.all_to_all)
gather = _forward(_T.gather)
scatter = _forward(_T.scatter)
send = _forward(_T.send)
recv = _forward(_T.recv)
isend = _forward(_T.isend)
irecv = _forward(_T.irecv)
broadcast_object_list = _forward(_T.broadcast_object_list)
all_gather_object = _forward(_T.all_gather_object)
gather_object = _forward(_T.gather_object)
scatter_object_list = _forward(_T.scatter_object_list)
all_gather_coalesced = _forward(_T.all_gather_coalesced)
reduce_scatter_coalesced = _forward(_T.reduce_scatter_coalesced)


all_to_all_quant_reduce = forwarding(
    _quantized.all_to_all_quant_reduce, get_communicator, __name__, method=False
)
