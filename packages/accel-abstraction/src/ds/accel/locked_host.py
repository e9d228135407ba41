"""Page-locked host memory that does not depend on a device runtime.

``torch.Tensor.pin_memory()`` asks the device runtime (CUDA, ROCm, ...) to lock the pages, so a
CPU-only process cannot pin at all. :class:`LockedHostMemory` locks them with ``mlock(2)``
itself: each allocation is a fresh anonymous mapping (page aligned, zero filled), locked, and
seen by torch as a CPU tensor. Locked pages are never swapped out, which is what host offload
buffers want, and they count against the memlock limit (``ulimit -l``).

Lifetime follows ``torch.pin_memory``: the mapping is returned to the system when the last tensor
that views it is gone. :meth:`LockedHostMemory.unlock` releases the lock (and the bookkeeping) at
once; the memory itself stays valid for views still alive, so an early unlock never leaves a
dangling tensor.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import threading
import weakref

import torch

from ds.interfaces.errors import AcceleratorError

_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return _libc


def _address(buffer: mmap.mmap) -> int:
    probe = ctypes.c_char.from_buffer(buffer)
    try:
        return ctypes.addressof(probe)
    finally:
        del probe  # the mapping cannot be released while a ctypes view exports it


class LockedHostMemory:
    """Allocates mlock'ed CPU tensors and answers whether a tensor lies in one.

    ``ranges`` maps each live locked allocation's start address to its end address; a tensor is
    locked when its whole byte extent falls inside one range (views and slices included).
    """

    def __init__(self) -> None:
        self.ranges: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        self._lock = threading.Lock()

    def alloc(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat, zero-filled, page-locked CPU tensor of ``numel`` elements of ``dtype``."""
        nbytes = int(numel) * torch.empty((), dtype=dtype).element_size()
        size = max(nbytes, 1)
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        begin = _address(buffer)
        if _c().mlock(ctypes.c_void_p(begin), ctypes.c_size_t(size)) != 0:
            err = ctypes.get_errno()
            buffer.close()
            raise AcceleratorError(
                f"mlock of {size} bytes failed: {os.strerror(err)}; locked host memory counts "
                "against the memlock limit: raise it (ulimit -l, or memlock in "
                "/etc/security/limits.conf) or allocate less"
            )
        with self._lock:
            self.ranges[begin] = begin + nbytes
            self._sizes[begin] = size
        # The tensor's storage holds the mapping; when the last view is gone the mapping is
        # unmapped (which also unlocks it) and the range forgotten.
        weakref.finalize(buffer, self._forget, begin)
        if numel == 0:
            return torch.empty(0, dtype=dtype)
        return torch.frombuffer(buffer, dtype=dtype, count=int(numel))

    def unlock(self, begin: int) -> bool:
        """Unlock the allocation starting at ``begin`` now; False if none starts there."""
        with self._lock:
            size = self._sizes.pop(begin, None)
            self.ranges.pop(begin, None)
        if size is None:
            return False
        _c().munlock(ctypes.c_void_p(begin), ctypes.c_size_t(size))
        return True

    def _forget(self, begin: int) -> None:
        with self._lock:
            self._sizes.pop(begin, None)
            self.ranges.pop(begin, None)

    def contains(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s bytes all lie in one live locked allocation."""
        if tensor.device.type != "cpu" or _storageless(tensor):
            return False
        ptr = tensor.data_ptr()
        end = ptr + tensor.numel() * tensor.element_size()
        with self._lock:
            return any(b <= ptr and end <= e for b, e in self.ranges.items())

    def start_of(self, tensor: torch.Tensor) -> int | None:
        """The start address of the allocation ``tensor`` lies in, if any."""
        if tensor.device.type != "cpu" or _storageless(tensor):
            return None
        ptr = tensor.data_ptr()
        with self._lock:
            return next((b for b, e in self.ranges.items() if b <= ptr < max(e, b + 1)), None)


def lock_failure(nbytes: int = 16 * 1024) -> str | None:
    """Why locking ``nbytes`` of host memory fails in this process (the memlock limit, most
    often), or None when it works."""
    try:
        LockedHostMemory().alloc(nbytes, torch.uint8)
    except AcceleratorError as e:
        return str(e)
    return None


def _storageless(tensor: torch.Tensor) -> bool:
    """Fake (tracing) tensors have no memory to look at."""
    try:
        from torch._subclasses.fake_tensor import is_fake
    except ImportError:  # older torch: no fake tensors to meet
        return False
    return bool(is_fake(tensor))


__all__ = ["LockedHostMemory", "lock_failure"]
