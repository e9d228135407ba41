"""Reads requested flat element ranges of logical tensors straight from shard files.

Only the overlapping bytes of each shard are read (seek + readinto into the output tensor), so a
rank loading 1/M of a checkpoint written by N ranks touches about 1/M of the bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ds.checkpoint._format import ShardEntry
from ds.interfaces.checkpoint import TensorMeta
from ds.interfaces.errors import CheckpointError


def dtype_from_name(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise CheckpointError(f"unknown dtype {name!r} in checkpoint manifest")
    return dt


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_metas(manifest: Mapping[str, Any]) -> dict[str, TensorMeta]:
    return {
        name: TensorMeta(name, tuple(int(s) for s in entry["shape"]), str(entry["dtype"]))
        for name, entry in manifest["tensors"].items()
    }


def shard_entries(manifest: Mapping[str, Any], name: str) -> list[ShardEntry]:
    return [ShardEntry(**s) for s in manifest["tensors"][name]["shards"]]


class FileCache:
    """Open-once read handles for the shard files of one load."""

    def __init__(self, root: str) -> None:
        self._root = root
        self._fds: dict[str, int] = {}

    def fd(self, file: str) -> int:
        fd = self._fds.get(file)
        if fd is None:
            path = os.path.join(self._root, file)
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise CheckpointError(
                    f"shard file {path} cannot be opened ({exc}); the checkpoint is incomplete"
                ) from exc
            self._fds[file] = fd
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _overlaps(entries: list[ShardEntry], start: int, stop: int) -> Iterator[ShardEntry]:
    for e in entries:
        if e.offset < stop and e.stop > start:
            yield e


def read_range(
    manifest: Mapping[str, Any],
    files: FileCache,
    name: str,
    offset: int,
    numel: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Elements [offset, offset + numel) of the flattened tensor ``name`` as a 1-D CPU tensor."""
    entry = manifest["tensors"].get(name)
    if entry is None:
        known = ", ".join(sorted(manifest["tensors"])[:8])
        raise CheckpointError(
            f"tensor {name!r} is not in the checkpoint (it holds {len(manifest['tensors'])} "
            f"tensors, e.g. {known}); check the parameter names"
        )
    meta = TensorMeta(name, tuple(entry["shape"]), entry["dtype"])
    if offset < 0 or numel < 0 or offset + numel > meta.numel:
        raise CheckpointError(
            f"request for {name!r} elements [{offset}, {offset + numel}) is outside the tensor's "
            f"{meta.numel} elements (shape {list(meta.shape)})"
        )
    dtype = dtype_from_name(meta.dtype)
    if out is None:
        out = torch.empty(numel, dtype=dtype)
    itemsize = out.element_size()
    out_bytes = out.view(torch.uint8).numpy()
    stop = offset + numel
    pos = offset  # first element not read yet; replicated shards (several ranks) are read once
    entries = sorted(_overlaps(shard_entries(manifest, name), offset, stop), key=lambda e: e.offset)
    for e in entries:
        if e.stop <= pos:
            continue
        if e.offset > pos:
            break
        lo, hi = pos, min(stop, e.stop)
        file_pos = e.byte_offset + (lo - e.offset) * itemsize
        dst = out_bytes.data[(lo - offset) * itemsize : (hi - offset) * itemsize]
        fd = files.fd(e.file)
        got = 0
        while got < len(dst):
            n = os.preadv(fd, [dst[got:]], file_pos + got)
            if n == 0:
                raise CheckpointError(
                    f"shard file {e.file} is truncated (reading {name!r}); the checkpoint is damaged"
                )
            got += n
        pos = hi
        if pos >= stop:
            break
    if pos < stop:
        raise CheckpointError(
            f"no shard of {name!r} holds elements [{pos}, {stop}) (requested [{offset}, {stop})); "
            "the checkpoint is incomplete"
        )
    return out
