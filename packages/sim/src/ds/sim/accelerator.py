"""A simulated GPU: fake ``cuda:N`` devices on the CPU, for placement, syncs and memory.

``DS_ACCELERATOR=simgpu`` (or ``set_accelerator("simgpu")``) selects :class:`SimGpuAccelerator`.
Tensors made while a :class:`SimDevice` is active are ``FakeTensor``s that report ``cuda:N`` and
carry no data (``torch._subclasses.fake_tensor.FakeTensorMode``; see :mod:`ds.sim._fake_cuda`
for what it takes to run autograd on them with a CPU build of torch). What that buys:

* **Placement.** An op that mixes ``cuda:N`` with ``cpu`` (or with ``cuda:M``) raises
  ``FakeTensorDeviceMismatchError``, as it would fail on a GPU, however small the model.
* **Host syncs.** Every ``.item()``/``float(t)``/``bool(t)``/``.tolist()`` of a device tensor,
  every blocking device-to-host copy (``.cpu()``), every ``event.synchronize()`` and
  ``synchronize()`` is recorded with its call site in :attr:`SimDevice.host_syncs`; the value
  returned is 0 (fake tensors have none).
* **Completion.** Queued device work (events, non-blocking copies) is complete only once the host
  waited for it: reading a pending non-blocking copy or the ``elapsed_time`` of an incomplete
  event raises (:mod:`ds.sim.events`).
* **Device selection.** A rank of :func:`ds.sim.world.run_world` starts as a fresh process does,
  with ``cuda:0`` current; its code must ``set_device(local_rank)`` (the strict communicator
  refuses a collective issued while another device is current).
* **Memory.** Current and peak bytes per device (``cuda:N``) and for the host (``cpu``), by
  construction from the tensors alive (:meth:`SimDevice.memory`), plus device<->host copy bytes.

Numbers are not simulated: losses and norms read as 0. Numerical parity stays with the gloo tests.

Use::

    from ds.sim.accelerator import SimDevice
    with SimDevice(index=3) as dev:          # this thread computes on fake cuda:3
        model = MyModel().to(dev.device)     # or build it under the mode
        ...
    dev.memory()["cuda:3"].peak, dev.host_syncs

A world of ranks (each rank its own device, a strict communicator checking NCCL's rules) is
driven by :func:`ds.sim.world.run_world`; see docs/training.md, "GPU".
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from typing import Any

import torch

from ds.accel.cuda import CudaNames
from ds.accel.host import AllFloatDtypes, HostRandom
from ds.accel.streams import StandInStreams
from ds.interfaces.accelerator import AcceleratorCapabilities
from ds.interfaces.errors import AcceleratorError
from ds.sim._fake_cuda import (
    MAX_DEVICES,
    autograd_context,
    data_follows_device,
    fake_cuda_runtime,
)
from ds.sim._observer import DeviceStats, HostSync, Observations, Observer
from ds.sim.events import SimEvent, SimStream

NAME = "simgpu"
DEFAULT_DEVICE_BYTES = 80 * 2**30

_local = threading.local()


def active_device() -> SimDevice | None:
    """The simulated device this thread computes on, if any."""
    return getattr(_local, "device", None)


def _sim_fake_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    class SimFakeTensorMode(FakeTensorMode):  # type: ignore[misc]
        # No constant propagation: the fake mode keeps the values of small host tensors
        # (``torch.tensor([0])``) and computes on them for real, so moving one to ``cuda:N``
        # would run a CUDA kernel on a machine that has none (the fake CUDA runtime says one
        # is there). Simulated tensors carry no values anyway.
        def may_turn_const(self, t: torch.Tensor) -> bool:
            return False

    return SimFakeTensorMode(allow_non_fake_inputs=True)


class SimDevice:
    """One simulated rank's device (``cuda:index``), active in this thread while entered.

    ``total_bytes`` is the device capacity reported by ``total_memory`` (80 GiB by default).
    Re-entering a device after leaving it keeps its books (memory, syncs) but makes new fake
    tensors; tensors from an earlier entry must not be used in a later one. ``selected=False``
    starts with ``cuda:0`` current, as a new process does, until ``set_device(index)``.

    ``host=True`` simulates a CPU rank (:mod:`ds.sim.cpu_rank`): its compute device is the host
    itself, ``cpu``, so the rank's "device" and host allocations are one memory, booked once.
    """

    def __init__(
        self,
        index: int = 0,
        total_bytes: int = DEFAULT_DEVICE_BYTES,
        *,
        selected: bool = True,
        host: bool = False,
    ) -> None:
        if not 0 <= index < MAX_DEVICES:
            raise AcceleratorError(
                f"simulated device index {index} is out of range: a simulated node has "
                f"{MAX_DEVICES} GPUs (cuda:0..cuda:{MAX_DEVICES - 1}); map ranks by local rank"
            )
        self.index = index
        self.host = host
        self.device = torch.device("cpu") if host else torch.device("cuda", index)
        self.total_bytes = total_bytes
        self.current = index if selected else 0  # the process's current device (set_device)
        self.obs = Observations()
        self.fake_mode: Any = None
        self._observer: Observer | None = None
        self._stack: contextlib.ExitStack | None = None
        self._previous: SimDevice | None = None

    # -- context --------------------------------------------------------------------------------
    def __enter__(self) -> SimDevice:
        if self._stack is not None:
            raise AcceleratorError(f"simulated device {self.device} is already active")
        stack = contextlib.ExitStack()
        stack.enter_context(fake_cuda_runtime())
        stack.enter_context(autograd_context())
        stack.enter_context(data_follows_device())
        mode = _sim_fake_mode()
        # A CPU rank's memory is its process's: charged by the pages written (ds.sim._pages).
        paged = "cpu" if self.host else None
        observer = Observer(self.obs, mode, paged)  # replaces the mode's memo (see Observer)
        stack.enter_context(mode)
        stack.enter_context(observer)
        self.fake_mode, self._observer, self._stack = mode, observer, stack
        self._previous = active_device()
        _local.device = self
        return self

    def __exit__(self, *exc: object) -> None:
        stack, self._stack = self._stack, None
        _local.device = self._previous
        self._previous = None
        if stack is not None:
            stack.close()

    @property
    def active(self) -> bool:
        return self._stack is not None

    # -- readings -------------------------------------------------------------------------------
    def memory(self) -> dict[str, DeviceStats]:
        """``{"cuda:N": DeviceStats(current, peak), "cpu": ...}`` in bytes (exact census)."""
        if self._observer is not None and self.active:
            self._observer.census()
        return {k: DeviceStats(v.current, v.peak) for k, v in self.obs.memory.items()}

    def device_bytes(self) -> DeviceStats:
        return self.memory().get(str(self.device), DeviceStats())

    def host_bytes(self) -> DeviceStats:
        return self.memory().get("cpu", DeviceStats())

    def touch(self, t: torch.Tensor) -> None:
        """Something no aten op shows (a file read, a collective's receive) wrote ``t``."""
        if self._observer is not None:
            self._observer.touch(t)

    def reset_peak(self) -> None:
        if self._observer is not None:
            if self.active:
                self._observer.census()
            self._observer.reset_peak()

    @property
    def host_syncs(self) -> list[HostSync]:
        return self.obs.host_syncs

    @property
    def copies(self) -> dict[str, int]:
        return {"d2h_bytes": self.obs.d2h_bytes, "h2d_bytes": self.obs.h2d_bytes}

    def record_sync(self, where: str, upto: int | None = None) -> None:
        """The host waited for this device's queue up to ``upto`` (all of it by default)."""
        self.obs.host_wait(str(self.device), where, upto)


class SimGpuAccelerator(CudaNames, StandInStreams, HostRandom, AllFloatDtypes):
    """``ds.interfaces.accelerator.Accelerator`` for simulated CUDA devices (see module docs).

    Available while a :class:`SimDevice` is active in this thread, or when ``DS_ACCELERATOR``
    names it; never chosen by detection.
    """

    _NAME = NAME
    stream_type = SimStream
    event_type = SimEvent

    def __init__(self) -> None:
        self._index = 0

    def _dev(self) -> SimDevice | None:
        return active_device()

    # identity -------------------------------------------------------------------------------
    def is_available(self) -> bool:
        return self._dev() is not None or os.environ.get("DS_ACCELERATOR", "") == NAME

    def capabilities(self) -> AcceleratorCapabilities:
        return AcceleratorCapabilities()

    def communication_backend_name(self) -> str:
        # The simulated world speaks NCCL's rules (ds.sim.comm).
        return "nccl"

    def visible_devices_envs(self) -> list[str]:
        return ["CUDA_VISIBLE_DEVICES"]

    def set_visible_devices_envs(self, env: dict[str, str], local_ranks: list[int]) -> None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(r) for r in local_ranks)

    # device management ------------------------------------------------------------------------
    def device_count(self) -> int:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
        return min(MAX_DEVICES, local) if local > 0 else MAX_DEVICES

    def current_device(self) -> int:
        dev = self._dev()
        return dev.current if dev is not None else self._index

    def current_device_name(self) -> str:
        return f"cuda:{self.current_device()}"

    def set_device(self, index: int) -> None:
        dev = self._dev()
        if dev is not None and dev.index != index:
            raise AcceleratorError(
                f"set_device({index}) on a rank simulated on cuda:{dev.index}: the device index "
                "must come from the rank's local rank"
            )
        if not 0 <= index < MAX_DEVICES:
            raise AcceleratorError(f"cuda:{index} does not exist on a simulated node")
        self._index = index
        if dev is not None:
            dev.current = index

    def synchronize(self, index: int | None = None) -> None:
        dev = self._dev()
        if dev is not None:
            dev.record_sync("accelerator.synchronize()")

    # memory -----------------------------------------------------------------------------------
    def _stats(self, index: int | None) -> DeviceStats:
        dev = self._dev()
        if dev is None:
            return DeviceStats()
        key = f"cuda:{dev.index if index is None else index}"
        return dev.memory().get(key, DeviceStats())

    def memory_allocated(self, index: int | None = None) -> int:
        return self._stats(index).current

    def max_memory_allocated(self, index: int | None = None) -> int:
        return self._stats(index).peak

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        dev = self._dev()
        if dev is not None:
            dev.reset_peak()

    def memory_reserved(self, index: int | None = None) -> int:
        return self.memory_allocated(index)

    def total_memory(self, index: int | None = None) -> int:
        dev = self._dev()
        return dev.total_bytes if dev is not None else DEFAULT_DEVICE_BYTES

    def available_memory(self, index: int | None = None) -> int:
        return max(0, self.total_memory(index) - self.memory_allocated(index))

    def memory_stats(self, index: int | None = None) -> Mapping[str, int]:
        stats = self._stats(index)
        return {
            "allocated_bytes.all.current": stats.current,
            "allocated_bytes.all.peak": stats.peak,
        }

    def empty_cache(self) -> None:
        return None

    # RNG (the host's generator; see HostRandom) ------------------------------------------------
    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        # The simulated device has no generator of its own; the host's stands in for it.
        with _outside_fake_mode():
            return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        return None  # a fake state (from a simulated checkpoint) has no bytes to restore

    # host memory ------------------------------------------------------------------------------
    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type != "cpu":
            raise AcceleratorError(
                f"pin_memory() needs a host tensor, got one on {tensor.device}; copy it to the "
                "host first"
            )
        tensor.__dict__["_ds_sim_pinned"] = True
        return tensor

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return bool(tensor.__dict__.get("_ds_sim_pinned", False))

    def unpin_memory(self, tensor: torch.Tensor) -> bool:
        return bool(tensor.__dict__.pop("_ds_sim_pinned", False))

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cuda"


@contextlib.contextmanager
def _outside_fake_mode() -> Any:
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield


__all__ = ["DeviceStats", "HostSync", "SimDevice", "SimEvent", "SimGpuAccelerator", "active_device"]
