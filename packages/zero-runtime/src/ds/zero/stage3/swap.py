"""NVMe residence of stage-3 parameter shards and optimizer state, through the kernel provider's
asynchronous file I/O handle (``KernelProvider.aio_handle``).

Each rank owns one swap file per kind under ``nvme_path``; every tensor has a fixed, block-aligned
region in it, so a shard is written once per step and read whenever its parameter is gathered.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import torch

from ds.interfaces.errors import ConfigError, ProviderNotFoundError
from ds.interfaces.kernels import AsyncIOHandle, KernelProvider
from ds.zero.stage3.pool import storage_refs
from ds.zero.stage3.shard import ShardState


@dataclass(frozen=True)
class AioSettings:
    """The ``aio`` config section."""

    block_size: int = 1 << 20
    queue_depth: int = 8
    thread_count: int = 1
    single_submit: bool = False
    overlap_events: bool = True
    use_o_direct: bool = False


def open_aio(kernels: KernelProvider | None, aio: AioSettings) -> AsyncIOHandle:
    if kernels is None:
        raise ProviderNotFoundError(
            "NVMe offload needs the asynchronous file I/O of a kernel provider and none was "
            "given; install ds-ops-kernels (pip install ds-ops-kernels), which registers the "
            "'cpu' provider in the 'ds.kernels' group, or set offload device to 'cpu'"
        )
    return kernels.aio_handle(
        block_size=aio.block_size,
        queue_depth=aio.queue_depth,
        intra_op_parallelism=aio.thread_count,
        single_submit=aio.single_submit,
        overlap_events=aio.overlap_events,
        use_o_direct=aio.use_o_direct,
    )


def _align(n: int, block: int) -> int:
    return -(-n // block) * block


class SwapFile:
    """Fixed regions of one file, addressed by key."""

    def __init__(self, handle: AsyncIOHandle, path: str, align: int = 4096) -> None:
        self.handle = handle
        self.path = path
        self.align = align
        self.regions: dict[Any, tuple[int, int]] = {}  # key -> (offset, nbytes)
        self.size = 0
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb"):
            pass

    def region(self, key: Any, nbytes: int) -> tuple[int, int]:
        if key not in self.regions:
            self.regions[key] = (self.size, nbytes)
            self.size += _align(nbytes, self.align)
        return self.regions[key]

    def write(self, key: Any, t: torch.Tensor, async_op: bool = False) -> None:
        off, _ = self.region(key, t.numel() * t.element_size())
        if async_op:
            self.handle.async_pwrite(t, self.path, off)
        else:
            self.handle.sync_pwrite(t, self.path, off)

    def read(self, key: Any, out: torch.Tensor, async_op: bool = False) -> None:
        off, _ = self.regions[key]
        if async_op:
            self.handle.async_pread(out, self.path, off)
        else:
            self.handle.sync_pread(out, self.path, off)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.remove(self.path)
        self.handle.close()


class ParamSwapper:
    """Keeps stage-3 parameter shards on NVMe, the first ``max_in_cpu`` elements excepted.

    Reads are pipelined with compute: :meth:`prefetch` starts asynchronous reads of the shards
    the recorded trace needs next into at most ``buffer_count`` buffers (reads in flight plus
    shards read but not yet gathered), so the disk works while earlier modules compute; a
    gather of a shard that was not prefetched reads it synchronously. With ``pin_memory`` the
    buffers come from the I/O handle's pinned (page-locked) allocator, which an accelerator can
    copy from without staging; on a host-only machine that only locks the pages.
    """

    def __init__(
        self,
        handle: AsyncIOHandle,
        nvme_path: str,
        rank: int,
        max_in_cpu: int = 0,
        buffer_count: int = 5,
        pin_memory: bool = False,
    ) -> None:
        if not nvme_path:
            raise ConfigError(
                "zero_optimization.offload_param.nvme_path is required when "
                "offload_param.device is 'nvme'; set it to a directory on a fast local disk"
            )
        if buffer_count < 1:
            raise ConfigError(
                f"zero_optimization.offload_param.buffer_count must be at least 1, got "
                f"{buffer_count}"
            )
        self.file = SwapFile(handle, os.path.join(nvme_path, f"ds_zero3_params_rank{rank}.swp"))
        self.max_in_cpu = max_in_cpu
        self.in_cpu = 0
        self.swapped_bytes = 0
        self.buffer_count = buffer_count
        self.pin_memory = pin_memory
        self._reading: dict[int, tuple[ShardState, torch.Tensor]] = {}  # in flight
        self._ready: dict[int, tuple[ShardState, torch.Tensor]] = {}  # read, not yet gathered
        self._pinned: dict[int, torch.Tensor] = {}  # data_ptr -> raw pinned allocation
        self.async_reads = 0
        self.sync_reads = 0
        self.peak_buffers = 0

    def register(self, s: ShardState) -> None:
        if self.in_cpu + s.shard_numel <= self.max_in_cpu:
            self.in_cpu += s.shard_numel
            return
        self.file.write(s.ds_id, s.shard.contiguous())
        s.extra["swap_device"] = s.shard.device
        s.extra["swapper"] = self
        s.shard = torch.empty(0, dtype=s.dtype, device=s.shard.device)
        s.swapped = True
        self.swapped_bytes += s.shard_bytes

    # -- buffers -------------------------------------------------------------------------------
    def _buffer(self, s: ShardState) -> torch.Tensor:
        if self.pin_memory:
            raw = self.file.handle.new_pinned_buffer(s.shard_bytes)
            buf = raw.view(torch.uint8)[: s.shard_bytes].view(s.dtype)
            self._pinned[buf.data_ptr()] = raw
            return buf
        return torch.empty(s.shard_numel, dtype=s.dtype, device=s.extra["swap_device"])

    def _free(self, buf: torch.Tensor) -> None:
        raw = self._pinned.pop(buf.data_ptr(), None) if buf.numel() else None
        # Back to the handle's pinned pool only when nothing but ``raw`` and ``buf`` holds it
        # (at world size 1 the gathered parameter is the shard buffer itself).
        if raw is not None and storage_refs(raw) <= 2:
            self.file.handle.free_pinned_buffer(raw)

    @property
    def buffers_held(self) -> int:
        return len(self._reading) + len(self._ready)

    # -- reads ---------------------------------------------------------------------------------
    def prefetch(self, states: list[ShardState]) -> None:
        """Start reading these shards (in order) while buffers are free."""
        for s in states:
            if self.buffers_held >= self.buffer_count:
                return
            if not s.swapped or s.shard.numel() == s.shard_numel:
                continue
            if s.ds_id in self._reading or s.ds_id in self._ready:
                continue
            buf = self._buffer(s)
            self.file.read(s.ds_id, buf, async_op=True)
            self._reading[s.ds_id] = (s, buf)
            self.async_reads += 1
            self.peak_buffers = max(self.peak_buffers, self.buffers_held)

    def _complete(self) -> None:
        if self._reading:
            self.file.handle.wait()
            self._ready.update(self._reading)
            self._reading.clear()

    def swap_in(self, s: ShardState) -> None:
        if s.shard.numel() == s.shard_numel:
            return
        if s.ds_id in self._reading:
            self._complete()
        got = self._ready.pop(s.ds_id, None)
        if got is not None:
            s.shard = got[1]
            s.extra["swap_buffer"] = got[1]
            return
        buf = self._buffer(s)
        self.file.read(s.ds_id, buf)
        self.sync_reads += 1
        s.shard = buf
        s.extra["swap_buffer"] = buf

    def drop(self, s: ShardState) -> None:
        buf = s.extra.pop("swap_buffer", None)
        s.shard = torch.empty(0, dtype=s.dtype, device=s.extra["swap_device"])
        if buf is not None:
            self._free(buf)

    def discard(self) -> None:
        """Forget every prefetched shard (before the optimizer rewrites them)."""
        self._complete()
        for _, buf in self._ready.values():
            self._free(buf)
        self._ready.clear()

    def write_back(self, s: ShardState, new_shard: torch.Tensor) -> None:
        self.file.write(s.ds_id, new_shard.contiguous())

    def close(self) -> None:
        self.discard()
        self.file.close()
