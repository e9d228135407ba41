"""A pool of 4 KiB-aligned (and, with an accelerator, page-locked) host buffers for file I/O.

Aligned buffers are what O_DIRECT needs; reusing them avoids paying for allocation (and pinning,
which is slow) on every transfer.
"""

from __future__ import annotations

import threading

import torch

from ds.interfaces.errors import ConfigError, KernelError

ALIGN = 4096


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class PinnedBufferPool:
    """Hands out uint8 tensors whose data starts on a 4096-byte boundary.

    ``pin_memory=None`` pins when CUDA is available (pinning needs an accelerator runtime).
    Freed buffers are kept, by rounded size, for the next request of that size.
    """

    def __init__(self, pin_memory: bool | None = None) -> None:
        self._pin = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
        self._lock = threading.Lock()
        self._free: dict[int, list[torch.Tensor]] = {}
        self._lent: dict[int, tuple[torch.Tensor, int]] = {}  # data_ptr -> (aligned base, size)

    @property
    def pinned(self) -> bool:
        return self._pin

    def get(self, num_bytes: int) -> torch.Tensor:
        if isinstance(num_bytes, bool) or not isinstance(num_bytes, int) or num_bytes <= 0:
            raise ConfigError(f"num_bytes must be a positive int, got {num_bytes!r}")
        cap = _round_up(num_bytes, ALIGN)
        with self._lock:
            cached = self._free.get(cap)
            base = cached.pop() if cached else None
        if base is None:
            raw = torch.empty(cap + ALIGN, dtype=torch.uint8, pin_memory=self._pin)
            skip = (-raw.data_ptr()) % ALIGN
            base = raw[skip : skip + cap]
        buf = base[:num_bytes]
        with self._lock:
            self._lent[buf.data_ptr()] = (base, cap)
        return buf

    def put(self, buffer: torch.Tensor) -> None:
        key = buffer.data_ptr() if isinstance(buffer, torch.Tensor) else None
        with self._lock:
            entry = self._lent.pop(key, None) if key is not None else None
            if entry is None:
                raise KernelError(
                    "free_pinned_buffer got a buffer this handle did not lend (or one already "
                    "freed); pass exactly the tensor returned by new_pinned_buffer"
                )
            base, cap = entry
            self._free.setdefault(cap, []).append(base)

    def lent(self) -> int:
        with self._lock:
            return len(self._lent)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
