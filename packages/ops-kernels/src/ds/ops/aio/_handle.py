"""Python face of the native block-wise I/O handle: argument checks, buffer lifetimes, errors."""

from __future__ import annotations

import atexit
import errno as errno_mod
import os
import weakref
from types import TracebackType
from typing import Any

import torch

from ds.interfaces.errors import AsyncIOError, ConfigError, KernelError
from ds.interfaces.logging import get_logger
from ds.ops._native import native
from ds.ops.aio._buffers import PinnedBufferPool

log = get_logger(__name__)

# Handles still open when the interpreter ends (held by a long-lived engine or a module global):
# closed at exit, so their writes in flight finish and the native handle and its threads are
# released before the extension module is torn down (which otherwise reports them as leaked).
_open: weakref.WeakSet[AsyncIOHandle] = weakref.WeakSet()


@atexit.register
def _close_open_handles() -> None:
    for handle in list(_open):
        try:
            handle.close()
        except Exception as exc:  # an I/O error at exit is reported, not raised over the exit
            log.warning("closing an AsyncIOHandle at exit failed", error=str(exc))


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive int, got {value!r}")
    return value


def _error(result: dict[str, Any], more: int = 0) -> AsyncIOError:
    code = int(result["error"])
    msg = str(result["message"])
    if more:
        msg += f" (and {more} more failed operation{'s' if more > 1 else ''} on this handle)"
    err = AsyncIOError(msg)
    # errno/filename as on any OSError; a short read has no errno of its own and reports EIO.
    err.errno = code if code > 0 else errno_mod.EIO
    err.strerror = msg
    err.filename = result["path"]
    return err


class AsyncIOHandle:
    """Block-wise parallel pread/pwrite; see ds.interfaces.kernels.AsyncIOHandle.

    * ``block_size``: bytes per pread/pwrite call (direct blocks are rounded up to 4 KiB).
    * ``queue_depth``: operations in flight before another submission blocks.
    * ``intra_op_parallelism``: I/O threads of this handle; an operation's blocks are split
      among them.
    * ``single_submit``: queue every block as its own task (fine interleaving of concurrent
      operations) instead of one contiguous slice per thread.
    * ``overlap_events``: let operations run concurrently; ``False`` starts each one only after
      the previous finished.
    * ``use_o_direct``: O_DIRECT for buffers, offsets and lengths aligned to 4 KiB (buffers from
      :meth:`new_pinned_buffer` are); buffered I/O otherwise or where the filesystem refuses it.

    Writes never truncate the file. Buffers must stay untouched until :meth:`wait` returns; the
    handle keeps them alive until then. Operations in flight together on overlapping parts of a
    file complete in no defined order: call :meth:`wait` between them.
    """

    def __init__(
        self,
        block_size: int = 1 << 20,
        queue_depth: int = 8,
        intra_op_parallelism: int = 1,
        single_submit: bool = False,
        overlap_events: bool = True,
        use_o_direct: bool = True,
        pin_memory: bool | None = None,
    ) -> None:
        self.block_size = _positive("block_size", block_size)
        self.queue_depth = _positive("queue_depth", queue_depth)
        self.intra_op_parallelism = _positive("intra_op_parallelism", intra_op_parallelism)
        self.single_submit = bool(single_submit)
        self.overlap_events = bool(overlap_events)
        self.use_o_direct = bool(use_o_direct)
        self._h: Any = native().AioHandle(
            self.block_size,
            self.queue_depth,
            self.intra_op_parallelism,
            self.single_submit,
            self.overlap_events,
            self.use_o_direct,
        )
        self._pool = PinnedBufferPool(pin_memory)
        self._live: dict[int, torch.Tensor] = {}
        _open.add(self)
        self.direct_bytes = 0  # bytes moved through O_DIRECT so far (both directions)
        self.total_bytes = 0

    # -- submission -----------------------------------------------------------------------
    def _bytes(self, buffer: torch.Tensor, writable: bool) -> torch.Tensor:
        if not isinstance(buffer, torch.Tensor):
            raise KernelError(f"buffer must be a torch.Tensor, got {type(buffer).__name__}")
        if buffer.device.type != "cpu":
            raise KernelError(
                f"file I/O needs a CPU (host) buffer, got one on {buffer.device}; copy it into "
                "a buffer from new_pinned_buffer first"
            )
        if not buffer.is_contiguous():
            raise KernelError("file I/O needs a contiguous buffer; call .contiguous() first")
        if writable and buffer.requires_grad:
            raise KernelError("cannot read a file into a tensor that requires grad; detach it")
        return buffer.detach().reshape(-1).view(torch.uint8)

    def _submit(self, write: bool, buffer: torch.Tensor, path: str, offset: int, keep: bool) -> int:
        if self._h is None:
            raise KernelError("this AsyncIOHandle is closed; create a new one")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ConfigError(f"offset must be a non-negative int, got {offset!r}")
        data = self._bytes(buffer, writable=not write)
        op = int(self._h.submit(write, data, os.fspath(path), offset, keep))
        if keep:
            self._live[op] = data
        return op

    def _account(self, result: dict[str, Any]) -> None:
        self.direct_bytes += int(result["direct_bytes"])
        self.total_bytes += int(result["bytes_done"])

    def _sync(self, write: bool, buffer: torch.Tensor, path: str, offset: int) -> int:
        op = self._submit(write, buffer, path, offset, keep=False)
        result = self._h.wait_op(op)
        self._account(result)
        if result["error"]:
            raise _error(result)
        return int(result["bytes_done"])

    def sync_pwrite(self, buffer: torch.Tensor, path: str, offset: int = 0) -> int:
        """Write all of ``buffer`` to ``path`` at ``offset``; returns the bytes written."""
        return self._sync(True, buffer, path, offset)

    def sync_pread(self, buffer: torch.Tensor, path: str, offset: int = 0) -> int:
        """Fill ``buffer`` from ``path`` at ``offset``; a file too short is an AsyncIOError."""
        return self._sync(False, buffer, path, offset)

    def async_pwrite(self, buffer: torch.Tensor, path: str, offset: int = 0) -> None:
        self._submit(True, buffer, path, offset, keep=True)

    def async_pread(self, buffer: torch.Tensor, path: str, offset: int = 0) -> None:
        self._submit(False, buffer, path, offset, keep=True)

    def wait(self) -> int:
        """Block until every async operation finished; returns how many completed since the
        last wait. Raises AsyncIOError (errno, file name) if any of them failed."""
        if self._h is None:
            return 0
        results = self._h.wait_all()
        failed = []
        for r in results:
            self._live.pop(int(r["id"]), None)
            self._account(r)
            if r["error"]:
                failed.append(r)
        if failed:
            for r in failed[1:]:
                log.warning("aio operation failed", path=r["path"], error=r["message"])
            raise _error(failed[0], more=len(failed) - 1)
        return len(results)

    # -- buffers --------------------------------------------------------------------------
    def new_pinned_buffer(self, num_bytes: int) -> torch.Tensor:
        """A uint8 tensor of ``num_bytes`` starting on a 4 KiB boundary (O_DIRECT-capable),
        page-locked when an accelerator is present. View it as any dtype."""
        return self._pool.get(num_bytes)

    def free_pinned_buffer(self, buffer: torch.Tensor) -> None:
        self._pool.put(buffer)

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for outstanding operations and release the threads; errors still raise."""
        if self._h is None:
            return
        try:
            self.wait()
        finally:
            self._h = None
            self._live.clear()
            self._pool.clear()

    def __enter__(self) -> AsyncIOHandle:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
