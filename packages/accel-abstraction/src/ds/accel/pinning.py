"""Which pinned-memory backend an accelerator's ``pin_memory`` uses, decided in one place.

``DS_PIN_MEMORY_BACKEND`` (read at each call, so a process may switch between engines):

* ``torch`` (default): the device runtime pins (``torch.Tensor.pin_memory()`` on CUDA); an
  accelerator without pinned memory (the CPU, MPS) hands tensors back as they are.
* ``native``: every accelerator pins through one process-wide :class:`NativePinnedMemory`
  (mlock'ed pages from :class:`~ds.accel.locked_host.LockedHostMemory`, no device runtime
  needed, so the CPU pins too) and :meth:`HostPinning.unpin_memory` releases a pin at once,
  which lets an engine return its offload buffers deterministically on ``destroy()``.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any

import torch

from ds.accel.locked_host import LockedHostMemory

BACKEND_ENV = "DS_PIN_MEMORY_BACKEND"
BACKENDS = ("torch", "native")


_warned: set[str] = set()


def pin_backend() -> str:
    """The selected backend. Like DeepSpeed, any value other than ``native`` means ``torch``;
    an unknown one is said once."""
    value = os.environ.get(BACKEND_ENV, "torch").strip().lower() or "torch"
    if value not in BACKENDS:
        if value not in _warned:
            _warned.add(value)
            warnings.warn(
                f"{BACKEND_ENV}={value!r} is not a pinned-memory backend ({', '.join(BACKENDS)}); "
                "pinning through 'torch'",
                stacklevel=2,
            )
        return "torch"
    return value


class NativePinnedMemory:
    """Copies (or allocates) tensors into locked host memory and tracks what it handed out.

    A pinned tensor carries ``ds_pinned = True`` and ``ds_pin_base`` (its allocation's start
    address, so :meth:`unpin` finds the allocation even after ``.data`` was rebound); views of it
    are recognised by address. ``_ranges`` maps each live allocation's start to its end.
    """

    def __init__(self, memory: LockedHostMemory | None = None) -> None:
        self._memory = memory if memory is not None else LockedHostMemory()

    @property
    def _ranges(self) -> dict[int, int]:
        return self._memory.ranges

    def pin(self, tensor: torch.Tensor, make_copy: bool = True, match_shape: bool = True) -> Any:
        shape = tuple(tensor.shape) if match_shape else (tensor.numel(),)
        locked = self.pin_empty(tensor, shape)
        if make_copy:
            locked.copy_(tensor.reshape(shape))
        return locked

    def pin_empty(self, example: torch.Tensor, shape: Any) -> Any:
        """A locked tensor of ``shape`` with ``example``'s dtype (contents zero)."""
        numel = 1
        for dim in shape:
            numel *= int(dim)
        flat = self._memory.alloc(numel, example.dtype)
        locked = flat.view(tuple(shape))
        locked.ds_pinned = True  # type: ignore[attr-defined]
        locked.ds_pin_base = flat.data_ptr()  # type: ignore[attr-defined]
        return locked

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        if getattr(tensor, "ds_pinned", False):
            return True
        if tensor.device.type == "meta":
            return False
        return self._memory.start_of(tensor) is not None

    def unpin(self, tensor: torch.Tensor) -> bool:
        """Unlock ``tensor``'s allocation now (its memory is returned once no view uses it)."""
        begin = getattr(tensor, "ds_pin_base", None)
        if begin is None:
            begin = self._memory.start_of(tensor)
        freed = begin is not None and self._memory.unlock(begin)
        if hasattr(tensor, "ds_pinned"):
            tensor.ds_pinned = False  # type: ignore[attr-defined]
        return freed


_shared: NativePinnedMemory | None = None
_shared_lock = threading.Lock()


def native_pinned_memory() -> NativePinnedMemory:
    """The process-wide native manager (one, so every component agrees on what is pinned)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = NativePinnedMemory()
        return _shared


def active_native_pins() -> NativePinnedMemory | None:
    """The native manager when ``DS_PIN_MEMORY_BACKEND=native``, else None."""
    return native_pinned_memory() if pin_backend() == "native" else None


class HostPinning:
    """The host-memory methods of an accelerator: the native backend when selected, the
    device runtime's pinning (``_device_pin_memory``/``_device_is_pinned``) otherwise."""

    _device_has_pinned_memory = False

    def _device_pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor  # no device runtime pinning: nothing to lock

    def _device_is_pinned(self, tensor: torch.Tensor) -> bool:
        return False

    def _has_pinned_memory(self) -> bool:
        """For ``capabilities().has_pinned_memory``: the native backend pins on any device."""
        return self._device_has_pinned_memory or active_native_pins() is not None

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        pins = active_native_pins()
        if pins is not None:
            return pins.pin(tensor)  # type: ignore[no-any-return]
        return self._device_pin_memory(tensor)

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        pins = active_native_pins()
        if pins is not None and pins.is_pinned(tensor):
            return True
        return self._device_is_pinned(tensor)

    def unpin_memory(self, tensor: torch.Tensor) -> bool:
        """Release a natively pinned ``tensor`` now (True if it was); memory pinned by the device
        runtime is released when garbage-collected, so this is False for it."""
        pins = active_native_pins()
        return bool(pins.unpin(tensor)) if pins is not None else False


__all__ = [
    "BACKENDS",
    "BACKEND_ENV",
    "HostPinning",
    "NativePinnedMemory",
    "active_native_pins",
    "native_pinned_memory",
    "pin_backend",
]
