"""Streaming per-partition optimizer state through a bounded set of NVMe swap buffers.

With ``offload_optimizer.device: nvme`` every partition's fp32 master weights and Adam moments
live in a swap file. The optimizer step reads them back partition by partition, steps, and
writes them out again. Reads of the next partitions run while the current one steps, through at
most ``buffer_count`` buffer sets (one set holds a partition's master, exp_avg and exp_avg_sq):
``buffer_count - 1`` partitions read ahead, plus the one being stepped whose writes are in
flight. The I/O handle's ``wait`` completes every outstanding request, so a set whose writes
were issued is reused only after the next ``wait``. With ``pin_memory`` the sets come from the
handle's page-locked allocator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Sequence

import torch

from ds.interfaces.errors import ConfigError
from ds.zero.stage3.swap import SwapFile

KINDS = ("m", "v", "w")  # master, exp_avg, exp_avg_sq

# The step walks a set's three views in lockstep, and buffers whose starts are congruent modulo a
# large power of two slow that walk down by up to 2.8x (docs/ops.md, "State placement"); with
# views exactly one partition apart, a partition of 2**23 fp32 elements would put all three at
# the same address modulo 32 MiB. So the views lie a stride apart that keeps each pair at least
# _GAP bytes from congruence modulo _PERIOD (the rule of ds.ops.placement, restated here because
# zero-runtime depends only on ds.interfaces).
_PERIOD = 32 << 20
_GAP = 64 << 10
_ALIGN = 1024  # elements (4 KiB): every view starts aligned for direct I/O


def view_stride(numel: int) -> int:
    """Elements from one view of a buffer set to the next: at least ``numel``, a multiple of
    4 KiB, and placing the three views pairwise apart."""

    def apart(nbytes: int) -> bool:
        d = nbytes % _PERIOD
        return min(d, _PERIOD - d) >= _GAP

    stride = -(-max(numel, 1) // _ALIGN) * _ALIGN
    while not (apart(4 * stride) and apart(8 * stride)):
        stride += _ALIGN
    return stride


class StateStream:
    def __init__(self, swap: SwapFile, buffer_count: int = 4, pin_memory: bool = False) -> None:
        if buffer_count < 1:
            raise ConfigError(
                "zero_optimization.offload_optimizer.buffer_count must be at least 1, got "
                f"{buffer_count}"
            )
        self.swap = swap
        self.buffer_count = buffer_count
        self.pin_memory = pin_memory
        self.peak_sets = 0  # most buffer sets held at once in the last run

    def _new_set(self, stride: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        nbytes = 3 * stride * 4
        if self.pin_memory:
            raw = self.swap.handle.new_pinned_buffer(nbytes)
            return raw.view(torch.uint8)[:nbytes].view(torch.float32), raw
        return torch.empty(3 * stride, dtype=torch.float32), None

    def run(
        self,
        parts: Sequence[tuple[Hashable, int]],
        step: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None],
    ) -> None:
        """For each ``(key, numel)`` in order, read the state stored under ``(key, kind)``,
        call ``step(i, master, exp_avg, exp_avg_sq)`` (which updates them in place) and write
        them back."""
        if not parts:
            return
        handle = self.swap.handle
        stride = view_stride(max(n for _, n in parts))
        ahead = self.buffer_count - 1
        free: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        held = 0
        reading: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        writing: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        owned: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self.peak_sets = 0

        def views(buf: torch.Tensor, n: int) -> list[torch.Tensor]:
            return [buf[k * stride : k * stride + n] for k in range(3)]

        def settle() -> None:
            nonlocal held, writing
            handle.wait()  # completes every request: reads issued so far and pending writes
            held -= len(writing)
            free.extend(writing)
            writing = []

        def read(j: int) -> None:
            nonlocal held
            if held >= self.buffer_count:
                settle()  # the set being written out is the one to reuse
            if free:
                bset = free.pop()
            else:
                bset = self._new_set(stride)
                owned.append(bset)
            held += 1
            self.peak_sets = max(self.peak_sets, held)
            key, n = parts[j]
            for kind, view in zip(KINDS, views(bset[0], n)):
                self.swap.read((key, kind), view, async_op=True)
            reading[j] = bset

        done = False
        try:
            for j in range(min(ahead, len(parts))):
                read(j)
            for i, (key, n) in enumerate(parts):
                if i not in reading:  # buffer_count 1: nothing reads ahead
                    read(i)
                settle()  # this partition's reads and the previous one's writes are done
                if ahead > 0 and i + ahead < len(parts):
                    read(i + ahead)
                bset = reading.pop(i)
                m, v, w = views(bset[0], n)
                step(i, m, v, w)
                for kind, view in zip(KINDS, (m, v, w)):
                    self.swap.write((key, kind), view, async_op=True)
                writing.append(bset)
            handle.wait()
            done = True
        finally:
            if not done:  # an error mid-stream: no request may still target these buffers
                with contextlib.suppress(Exception):
                    handle.wait()
            if self.pin_memory:
                for _, raw in owned:
                    if raw is not None:
                        handle.free_pinned_buffer(raw)
