"""Returning the C heap's free pages to the operating system at a step's high-water mark.

Stage 3's transients (gathered weights, full gradients, landing partitions) share the C heap
with the activations. glibc keeps freed memory resident for reuse, so a heap that has served a
few steps holds, besides what is in use, holes left by earlier phases; at the start of backward,
when every activation is alive and the output layer's weight and gradient are whole, those
holes add to the step's peak resident set. Releasing them just before that moment costs the
page faults of refilling the pages that are reused later in the step (a few thousand per step
on a 27M-parameter model), and the peak then tracks what is actually in use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim() -> object | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None


def release_free_heap() -> None:
    """Give the heap's free pages back to the operating system (glibc ``malloc_trim``; without
    glibc this does nothing)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)  # type: ignore[operator]
