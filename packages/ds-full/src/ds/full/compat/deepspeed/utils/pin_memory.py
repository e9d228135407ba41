"""``deepspeed.utils.pin_memory``: DeepSpeed's native pinned-memory backend, which is ds.accel's
(:mod:`ds.accel.pinning`: mlock'ed host pages, no device runtime needed).

``DS_PIN_MEMORY_BACKEND=native`` selects it process-wide (:func:`get_active_native_pinned_memory`);
the default (``torch``) leaves pinning to the accelerator. ``pin_handle()`` is the handle
DeepSpeed's ``PinMemoryBuilder().load()`` returns.
"""

from __future__ import annotations

import torch

from ds.accel.locked_host import LockedHostMemory
from ds.accel.pinning import NativePinnedMemory, active_native_pins, native_pinned_memory


class _PinHandle:
    """DeepSpeed's pin_memory op handle: ``new_cpu_locked_tensor``/``free_cpu_locked_tensor``;
    each handle tracks the allocations it made."""

    def __init__(self, memory: LockedHostMemory) -> None:
        self._memory = memory

    def new_cpu_locked_tensor(self, num_elem: int, example: torch.Tensor) -> torch.Tensor:
        return self._memory.alloc(int(num_elem), example.dtype)

    def free_cpu_locked_tensor(self, tensor: torch.Tensor) -> bool:
        return self._memory.unlock(tensor.data_ptr())

    def free_cpu_locked_tensor_by_ptr(self, ptr: int) -> bool:
        return self._memory.unlock(int(ptr))

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return self._memory.contains(tensor)


def pin_handle() -> _PinHandle:
    return _PinHandle(LockedHostMemory())


# What this module has handed out: ds.accel's process-wide manager, once the pin_memory op loaded.
_shared_native_pins: NativePinnedMemory | None = None


def get_native_pinned_memory() -> NativePinnedMemory:
    """The process-wide native manager (one, so every component agrees on what is pinned).

    As in DeepSpeed, native pinning is the pin_memory op: when the op cannot be loaded, selecting
    the backend fails here rather than silently pinning through torch."""
    global _shared_native_pins
    if _shared_native_pins is None:
        from ds.full.compat.deepspeed.ops import op_builder

        try:
            op_builder.PinMemoryBuilder().load()
        except Exception as exc:
            raise RuntimeError(
                "DS_PIN_MEMORY_BACKEND=native needs the pin_memory op, which could not be "
                f"loaded ({exc}); unset DS_PIN_MEMORY_BACKEND to pin through the accelerator"
            ) from exc
        _shared_native_pins = native_pinned_memory()
    return _shared_native_pins


def get_active_native_pinned_memory() -> NativePinnedMemory | None:
    """The native manager when ``DS_PIN_MEMORY_BACKEND=native``, else None."""
    if active_native_pins() is None:
        return None
    return get_native_pinned_memory()


__all__ = [
    "NativePinnedMemory",
    "get_active_native_pinned_memory",
    "get_native_pinned_memory",
    "pin_handle",
]
