"""``deepspeed.utils.pin_memory``: DeepSpeed's native pinned-memory backend on ds.accel's
:class:`~ds.accel.locked_host.LockedHostMemory` (mlock'ed host pages, no device runtime needed).

``DS_PIN_MEMORY_BACKEND=native`` selects it process-wide (:func:`get_active_native_pinned_memory`);
the default (``torch``) leaves pinning to the accelerator. ``pin_handle()`` is the handle
DeepSpeed's ``PinMemoryBuilder().load()`` returns.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ds.accel.locked_host import LockedHostMemory


class NativePinnedMemory:
    """Copies (or allocates) tensors into locked host memory and tracks what it handed out.

    A pinned tensor carries ``ds_pinned = True`` and ``ds_pin_base`` (its allocation's start
    address, so :meth:`unpin` finds the allocation even after ``.data`` was rebound); views of it
    are recognised by address.
    """

    def __init__(self) -> None:
        # Native pinning is the pin_memory op (as in DeepSpeed): when that op cannot be loaded,
        # selecting the backend fails here rather than silently pinning through torch.
        from ds.full.compat.deepspeed.ops import op_builder

        try:
            handle = op_builder.PinMemoryBuilder().load().pin_handle()
        except Exception as exc:
            raise RuntimeError(
                "DS_PIN_MEMORY_BACKEND=native needs the pin_memory op, which could not be "
                f"loaded ({exc}); unset DS_PIN_MEMORY_BACKEND to pin through the accelerator"
            ) from exc
        self._memory: LockedHostMemory = handle._memory

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


_shared_native_pins: NativePinnedMemory | None = None


def pin_handle() -> _PinHandle:
    return _PinHandle(LockedHostMemory())


def get_native_pinned_memory() -> NativePinnedMemory:
    """The process-wide native manager (one, so every component agrees on what is pinned)."""
    global _shared_native_pins
    if _shared_native_pins is None:
        _shared_native_pins = NativePinnedMemory()
    return _shared_native_pins


def get_active_native_pinned_memory() -> NativePinnedMemory | None:
    """The native manager when ``DS_PIN_MEMORY_BACKEND=native``, else None."""
    if os.environ.get("DS_PIN_MEMORY_BACKEND", "torch").strip().lower() != "native":
        return None
    return get_native_pinned_memory()


__all__ = [
    "NativePinnedMemory",
    "get_active_native_pinned_memory",
    "get_native_pinned_memory",
    "pin_handle",
]
