"""What a simulated device sees: every op on fake tensors, for memory, host syncs and copies.

:class:`Observer` is a ``TorchDispatchMode`` entered inside ``FakeTensorMode``, so it sees each
aten op before the fake mode runs it.

* **Memory.** Each op's outputs are charged to their storage's device (``cuda:N`` or ``cpu``): a
  storage is counted once however many views share it, and released when the storage itself
  dies, which a weak reference to it reports (torch keeps a storage's Python object for as long
  as the storage lives, and ``torch.utils.swap_tensors``, hence ``module.to()``, refuses only
  tensors with weak references, not storages). Release is therefore exact whoever held the
  storage last: a view, a re-pointed tensor (``p.data = ...``), autograd. Current and peak bytes
  are kept per device. A storage no op made (a real tensor converted on first use) is booked by
  :meth:`Observer.census`, run every few thousand ops and before every memory reading, which
  walks the live fake tensors. With ``paged`` set (a CPU rank's host), an uninitialised
  allocation on that device is charged by the pages written into it instead
  (:mod:`ds.sim._pages`).
* **Host syncs.** ``aten._local_scalar_dense`` (``.item()``, ``float(t)``, ``bool(t)``,
  ``.tolist()``) on a device tensor, and a blocking device-to-host copy (``.cpu()``,
  ``.to("cpu")``, ``host.copy_(t)``), are where a real GPU run waits for the device: each is
  recorded with its call site and completes all the device work queued so far (see
  :mod:`ds.sim.events`). Fake tensors have no values, so a read answers 0
  (``False``/``0``/``0.0``).
* **Pending copies.** A non-blocking device-to-host copy is queued device work: the host tensor
  it fills may be read (``.item()``, ``.tolist()``, ...) only once the host waited for it (an
  event recorded after it was synchronized, or any later full wait); reading it earlier raises
  ``AcceleratorError`` at the read.
* **Copies.** Device-to-host and host-to-device copies are counted in bytes.
"""

from __future__ import annotations

import functools
import gc
import sys
import traceback
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ds.interfaces.errors import AcceleratorError
from ds.sim._pages import UNINITIALISED, Pages, extent, written

_aten = torch.ops.aten
# Under torch.inference_mode ``item`` reaches the dispatch mode whole instead of as
# ``_local_scalar_dense`` (no autograd key decomposes it first).
_SCALAR = (_aten._local_scalar_dense.default, _aten.item.default)
_COPIES = (_aten._to_copy.default, _aten.copy_.default, _aten.copy.default)
_PENDING = "_ds_sim_pending"  # on a host tensor a non-blocking copy fills: its queue position
_CENSUS_EVERY = 4096


@dataclass
class HostSync:
    """One device-to-host synchronisation and where the code asked for it."""

    device: str
    where: str


@dataclass
class DeviceStats:
    current: int = 0
    peak: int = 0


@dataclass
class Observations:
    """Everything one simulated rank's observer recorded."""

    memory: dict[str, DeviceStats] = field(default_factory=lambda: defaultdict(DeviceStats))
    host_syncs: list[HostSync] = field(default_factory=list)
    d2h_bytes: int = 0
    h2d_bytes: int = 0
    # The device's one queue: positions of queued work (recorded events, non-blocking copies)
    # and how far the host has waited for it.
    issued: int = 0
    completed: int = 0

    def issue(self) -> int:
        """Queue one piece of device work; its position in the queue."""
        self.issued += 1
        return self.issued

    def host_wait(self, device: str, where: str, upto: int | None = None) -> None:
        """The host waited (a host sync) for the queue up to ``upto`` (everything by default)."""
        self.host_syncs.append(HostSync(device, where))
        self.completed = max(self.completed, self.issued if upto is None else upto)


def _call_site() -> str:
    """The innermost frame outside torch and this module: the code that asked for the value."""
    for frame in reversed(traceback.extract_stack(sys._getframe(2), limit=40)):
        name = frame.filename.replace("\\", "/")
        if "/torch/" in name or name.endswith("/ds/sim/_observer.py"):
            continue
        return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "<unknown>"


class Observer(TorchDispatchMode):
    def __init__(self, obs: Observations, fake_mode: Any, paged: str | None = None) -> None:
        super().__init__()
        self.obs = obs
        self.fake_mode = fake_mode
        self.paged = paged  # the device whose uninitialised allocations cost their written pages
        # storage key -> [device, bytes charged, storage bytes, Pages or None, weak reference]
        self._storages: dict[int, list[Any]] = {}
        self._ops = 0
        # The fake mode memoises every tensor it makes (meta id -> fake) in a weak-valued dict,
        # and those weak references make torch.utils.swap_tensors, hence module.to(), refuse
        # fake parameters. A plain dict emptied after every op keeps no tensor alive and no weak
        # reference on any; the memo is only needed within one conversion.
        self._memo: dict[Any, Any] = {}
        fake_mode.fake_tensor_converter.meta_converter.tensor_memo = self._memo

    def census(self) -> None:
        """Book the storages of live fake tensors of this mode that no op made (one heap walk)."""
        from torch._subclasses.fake_tensor import FakeTensor

        for obj in gc.get_objects():
            if type(obj) is FakeTensor and obj.fake_mode is self.fake_mode:
                self._charge(obj)

    # -- memory ---------------------------------------------------------------------------------
    def _charge(self, t: torch.Tensor, uninitialised: bool = False) -> None:
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = storage._cdata
        nbytes = int(storage.nbytes())
        entry = self._storages.get(key)
        if entry is None:
            device = str(t.device)
            paged = uninitialised and device == self.paged
            # A paged storage starts with nothing charged: its size is known, no page written.
            entry = [device, 0, nbytes if paged else -1, Pages(nbytes) if paged else None, None]
            # The callback runs when the storage dies, before its address can be reused.
            entry[4] = weakref.ref(storage, functools.partial(self._release, key, entry))
            self._storages[key] = entry
        if nbytes != entry[2]:  # new, or resized in place: charged in full from here
            self._add(entry[0], nbytes - entry[1])
            entry[1] = entry[2] = nbytes
            entry[3] = None

    def touch(self, t: torch.Tensor) -> None:
        """``t``'s elements were written: charge the pages of a paged storage they fill."""
        try:
            entry = self._storages.get(t.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError):
            return
        if entry is None or entry[3] is None:
            return
        pages: Pages = entry[3]
        pages.write(*extent(t))
        resident = pages.resident()
        self._add(entry[0], resident - entry[1])
        entry[1] = resident
        if pages.full:
            entry[3] = None  # every page written: an ordinary storage from here

    def _add(self, device: str, delta: int) -> None:
        stats = self.obs.memory[device]
        stats.current += delta
        if stats.current > stats.peak:
            stats.peak = stats.current

    def _release(self, key: int, entry: list[Any], _ref: Any) -> None:
        if self._storages.get(key) is entry:
            del self._storages[key]
            self._add(entry[0], -entry[1])

    def reset_peak(self, device: str | None = None) -> None:
        for name, stats in self.obs.memory.items():
            if device is None or name == device:
                stats.peak = stats.current

    # -- dispatch -------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _SCALAR:
            t = args[0]
            if t.device.type != "cpu":
                self.obs.host_wait(str(t.device), _call_site())
            else:
                self._require_complete(t)
            if t.dtype == torch.bool:
                return False
            return 0.0 if t.is_floating_point() or t.is_complex() else 0
        out = func(*args, **kwargs)
        self._memo.clear()
        self._ops += 1
        if self._ops % _CENSUS_EVERY == 0:
            self.census()
        if func in _COPIES:
            self._count_copy(func, args, kwargs, out)
        fresh = self.paged is not None and func in UNINITIALISED
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._charge(t, fresh)
        if self.paged is not None:
            for t in written(func, args, kwargs):
                self.touch(t)
        return out

    def _count_copy(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        if func is _aten.copy_.default or func is _aten.copy.default:
            dst, src = args[0], args[1]
        else:
            src, dst = args[0], out
        if not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor):
            return
        nbytes = src.numel() * src.element_size()
        if src.device.type != "cpu" and dst.device.type == "cpu":
            self.obs.d2h_bytes += nbytes
            non_blocking = kwargs.get("non_blocking", len(args) > 2 and bool(args[2]))
            if non_blocking:
                dst.__dict__[_PENDING] = self.obs.issue()
            else:
                self.obs.host_wait(str(src.device), f"{_call_site()} (device-to-host copy)")
                dst.__dict__.pop(_PENDING, None)
        elif src.device.type == "cpu" and dst.device.type != "cpu":
            self.obs.h2d_bytes += nbytes

    def _require_complete(self, t: torch.Tensor) -> None:
        queued = t.__dict__.get(_PENDING)
        if queued is not None and queued > self.obs.completed:
            raise AcceleratorError(
                f"{_call_site()} reads a host tensor that a non-blocking device-to-host copy is "
                "still filling: record an event after the copy and wait for it "
                "(event.synchronize()) before reading, or copy with non_blocking=False"
            )
