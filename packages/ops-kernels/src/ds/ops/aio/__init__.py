"""Asynchronous block-wise file I/O for NVMe offload and checkpoint writes.

``AsyncIOHandle`` implements :class:`ds.interfaces.kernels.AsyncIOHandle` on a native pool of
I/O threads doing pread/pwrite in blocks, with O_DIRECT for aligned buffers (see
:meth:`AsyncIOHandle.new_pinned_buffer`) and a buffered fallback where the filesystem refuses it.
"""

from __future__ import annotations

from ds.ops.aio._buffers import PinnedBufferPool
from ds.ops.aio._handle import AsyncIOHandle

__all__ = ["AsyncIOHandle", "PinnedBufferPool"]
