"""Shard writers: plain Python file I/O, and the kernel provider's asynchronous I/O handle.

A writer receives a shard file path and its pieces (byte offset, 1-D uint8 CPU tensor), writes them
with zero padding between pieces, fsyncs the file and returns the SHA-256 of the bytes on disk.
Hashing runs on a helper thread in step with the writes: both release the GIL, so the checksum costs
little extra wall time.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from ds.interfaces.errors import CheckpointError, ConfigError, KernelError, ProviderNotFoundError

if TYPE_CHECKING:
    import torch

Piece = tuple[int, "torch.Tensor"]
# progress(n): n more bytes of the shard are written
ProgressFn = Callable[[int], None]

# Big pieces are written and hashed in chunks so hashing chunk k overlaps writing chunk k+1.
_CHUNK = 64 << 20


def _chunks(pieces: Sequence[Piece]) -> list[tuple[int, memoryview]]:
    """(byte offset, bytes) chunks of every piece, zero padding emitted explicitly."""
    out: list[tuple[int, memoryview]] = []
    pos = 0
    for byte_offset, t in pieces:
        if byte_offset < pos:
            raise CheckpointError(f"shard pieces overlap at byte {byte_offset}; layout bug")
        if byte_offset > pos:
            out.append((pos, memoryview(bytes(byte_offset - pos))))
        view = t.numpy().data.cast("B")
        for start in range(0, len(view), _CHUNK):
            out.append((byte_offset + start, view[start : start + _CHUNK]))
        pos = byte_offset + len(view)
    return out


class ShardWriter(Protocol):
    """``write(path, pieces, checksum)``; a writer whose ``write`` also takes ``progress=`` calls
    it with the bytes written as it goes."""

    name: str

    def write(self, path: str, pieces: Sequence[Piece], checksum: bool) -> str | None: ...


class PythonWriter:
    """Buffered-free ``os.write`` of each chunk; the portable default."""

    name = "python"

    def write(
        self,
        path: str,
        pieces: Sequence[Piece],
        checksum: bool,
        progress: ProgressFn | None = None,
    ) -> str | None:
        digest = hashlib.sha256() if checksum else None
        with ThreadPoolExecutor(1) as hasher:
            pending: list[Any] = []
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for _, chunk in _chunks(pieces):
                    if digest is not None:
                        pending.append(hasher.submit(digest.update, chunk))
                    written = 0
                    while written < len(chunk):
                        written += os.write(fd, chunk[written:])
                    if progress is not None:
                        progress(len(chunk))
                os.fsync(fd)
            finally:
                os.close(fd)
            for fut in pending:
                fut.result()
        return digest.hexdigest() if digest is not None else None


class AioWriter:
    """Writes through ``KernelProvider.aio_handle`` (ds-ops-kernels) with O_DIRECT.

    The shard is assembled in one 4 KiB-aligned host buffer from the handle (kept and reused by
    the next save), so the handle can send the aligned bulk past the page cache with O_DIRECT
    (its unaligned tail goes through a buffered descriptor); the SHA-256 is computed from the
    buffer while the handle writes.
    """

    name = "aio"

    def __init__(
        self, provider: Any, block_size: int = 8 << 20, queue_depth: int = 8, o_direct: bool = True
    ) -> None:
        if not hasattr(provider, "aio_handle"):
            raise ConfigError(
                f"kernel provider {provider!r} has no aio_handle; checkpoint.writer='aio' needs "
                "the ds-ops-kernels provider (pip install ds-ops-kernels)"
            )
        try:
            self._handle = provider.aio_handle(
                block_size=block_size, queue_depth=queue_depth, use_o_direct=o_direct
            )
        except (ImportError, NotImplementedError, KernelError) as exc:
            raise ConfigError(
                f"checkpoint.writer='aio': the kernel provider cannot open an async I/O handle "
                f"({exc}); install a ds-ops-kernels build with aio (pip install ds-ops-kernels) "
                "or set checkpoint.writer='python'"
            ) from exc
        self._buf: Any = None

    def _buffer(self, size: int) -> Any:
        if self._buf is None or int(self._buf.numel()) < size:
            if self._buf is not None:
                self._handle.free_pinned_buffer(self._buf)
            self._buf = self._handle.new_pinned_buffer(max(size, 4096))
        return self._buf[:size]

    def write(
        self,
        path: str,
        pieces: Sequence[Piece],
        checksum: bool,
        progress: ProgressFn | None = None,
    ) -> str | None:
        size = 0
        for byte_offset, t in pieces:
            size = max(size, byte_offset + int(t.numel()))
        buf = self._buffer(size)
        pos = 0
        for byte_offset, t in pieces:
            if byte_offset > pos:
                buf[pos:byte_offset].zero_()  # padding is zeros, as the Python writer writes
            n = int(t.numel())
            if n:
                buf[byte_offset : byte_offset + n].copy_(t)
            pos = byte_offset + n
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.close(fd)
        if size:
            self._handle.async_pwrite(buf, path, 0)
        digest = hashlib.sha256() if checksum else None
        if digest is not None and size:
            view = buf.numpy().data
            for start in range(0, size, _CHUNK):  # hashes from memory while the handle writes
                digest.update(view[start : start + _CHUNK])
        try:
            self._handle.wait()
        except OSError as exc:
            raise CheckpointError(f"asynchronous write of {path} failed: {exc}") from exc
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if progress is not None:  # one submission: the whole shard at once
            progress(size)
        return digest.hexdigest() if digest is not None else None

    def close(self) -> None:
        if self._buf is not None:
            self._handle.free_pinned_buffer(self._buf)
            self._buf = None
        self._handle.close()


def make_writer(kind: str, kernels: Any | None = None) -> ShardWriter:
    """Build the writer named by ``checkpoint.writer``; 'aio' never falls back silently."""
    if kind == "python":
        return PythonWriter()
    if kind == "aio":
        provider = kernels
        if provider is None:
            from ds.interfaces import registry

            try:
                found = registry.get(registry.KERNELS, "cpu")
            except ProviderNotFoundError as exc:
                raise ConfigError(
                    "checkpoint.writer='aio' needs the asynchronous I/O handle of ds-ops-kernels, "
                    "which is not installed (pip install ds-ops-kernels), or set "
                    "checkpoint.writer='python'"
                ) from exc
            provider = found() if isinstance(found, type) else found
        return AioWriter(provider)
    raise ConfigError(
        f"checkpoint.writer={kind!r} is not a writer; use 'python' or 'aio' (ds-ops-kernels)"
    )
