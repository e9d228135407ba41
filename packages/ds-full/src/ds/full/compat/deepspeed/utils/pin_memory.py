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


def get_native_pinned_memory() -> NativePinnedMemory:
    """The process-wide native manager (one, so every component agrees on what is pinned)."""
    return native_pinned_memory()


def get_active_native_pinned_memory() -> NativePinnedMemory | None:
    """The native manager when ``DS_PIN_MEMORY_BACKEND=native``, else None."""
    return active_native_pins()


__all__ = [
    "NativePinnedMemory",
    "get_active_native_pinned_memory",
    "get_native_pinned_memory",
    "pin_handle",
]
