"""Host memory as the kernel pages it in: an allocation costs nothing until its pages are written.

On a rank without a GPU every tensor lives in the process's own memory, and what the job pays
(its RSS) is the pages written, not the bytes allocated: ``torch.empty`` of a large buffer maps
fresh pages that become resident at their first write, and a buffer sized for the largest of
several uses costs only what the uses wrote. ds allocates such buffers (NVMe swap buffer sets
sized by the largest partition and reused for smaller ones), so a CPU rank whose allocations
were charged in full would read high by the unwritten part. A GPU's memory is another matter
(an allocation is its memory), and so is pinned host memory (locked in at allocation), which
is why only a CPU rank's simulation charges by pages (:mod:`ds.sim.cpu_rank`).

:class:`Pages` keeps the written pages of one uninitialised storage; :func:`written` names the
tensors an aten op writes (its schema's mutated arguments), which is how the observer knows
that a view of a buffer was filled. Writes that no aten op makes (a file read into a buffer, a
collective's receive) are reported by the code that simulates them (``SimDevice.touch``).
"""

from __future__ import annotations

import bisect
from functools import cache
from typing import Any

import torch

PAGE = 4096

_aten = torch.ops.aten
# Allocations whose contents are undefined: nothing is written, so no page is resident yet.
UNINITIALISED = frozenset(
    {
        _aten.empty.memory_format,
        _aten.empty_strided.default,
        _aten.new_empty.default,
        _aten.new_empty_strided.default,
        _aten.empty_like.default,
    }
)
# Mutating by the schema but writing no element: they re-point or resize a tensor's storage.
_NOT_WRITES = frozenset({_aten.set_, _aten.resize_, _aten.resize_as_})


class Pages:
    """The written pages of a storage of ``capacity`` bytes, as sorted disjoint page ranges."""

    __slots__ = ("capacity", "ends", "starts")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.starts: list[int] = []
        self.ends: list[int] = []

    def resident(self) -> int:
        """Bytes of the written pages (the last page counts only up to the storage's end)."""
        total = sum(e - s for s, e in zip(self.starts, self.ends)) * PAGE
        if self.ends and self.ends[-1] * PAGE > self.capacity:
            total -= self.ends[-1] * PAGE - self.capacity
        return total

    def write(self, start: int, end: int) -> None:
        """Bytes ``[start, end)`` were written."""
        if end <= start:
            return
        lo, hi = start // PAGE, -(-end // PAGE)
        i = bisect.bisect_left(self.ends, lo)  # first range that ends at or after lo
        j = bisect.bisect_right(self.starts, hi)  # ranges from i to j-1 touch [lo, hi)
        if i < j:
            lo = min(lo, self.starts[i])
            hi = max(hi, self.ends[j - 1])
        self.starts[i:j] = [lo]
        self.ends[i:j] = [hi]

    @property
    def full(self) -> bool:
        return (
            len(self.starts) == 1 and self.starts[0] == 0 and self.ends[0] * PAGE >= self.capacity
        )


def extent(t: torch.Tensor) -> tuple[int, int]:
    """Bytes ``[start, end)`` of its storage that ``t``'s elements span."""
    if t.numel() == 0:
        return 0, 0
    size = t.element_size()
    start = t.storage_offset() * size
    last = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return start, start + (last + 1) * size


@cache
def _written_args(func: Any) -> tuple[tuple[int, str], ...]:
    if func.overloadpacket in _NOT_WRITES:
        return ()
    return tuple(
        (i, a.name)
        for i, a in enumerate(func._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )


def written(func: Any, args: Any, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors ``func(*args, **kwargs)`` writes into (in-place and ``out=`` arguments)."""
    out: list[torch.Tensor] = []
    for i, name in _written_args(func):
        value = args[i] if i < len(args) else kwargs.get(name)
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out
