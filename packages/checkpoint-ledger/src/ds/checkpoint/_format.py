"""On-disk layout of a sharded checkpoint and its manifest.

A checkpoint ``<directory>/<tag>/`` holds one raw shard file per rank (the bytes of that rank's
local tensor pieces, each starting at a 64-byte aligned offset), one pickle of the rank-independent
objects, one pickle per rank of per-rank objects, and ``manifest.json``. The manifest records, for
every logical tensor, which flat element range each shard file holds and at which byte offset, so a
reader seeks straight to the bytes it needs whatever world size wrote them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from ds.interfaces.errors import CheckpointError

FORMAT_NAME = "ds-sharded-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
LATEST = "latest"
OBJECTS = "objects.pt"
ALIGN = 64


class CheckpointPathError(CheckpointError):
    """A tag (given, or read from a ``latest`` file) that names no directory inside the checkpoint
    directory (``..``, a path, an absolute path): an operator's error, not a damaged checkpoint."""


class CheckpointDamagedError(CheckpointError):
    """A checkpoint file that differs from the digest its manifest records (or is missing): the
    checkpoint was changed or damaged. ``ds checkpoint`` exits 1 for it, 2 for operator errors."""


def check_tag(tag: str, source: str | None = None) -> str:
    """``tag`` if it is a plain directory name inside the checkpoint directory, else raise.

    ``source`` is the file the tag was read from (a ``latest`` file), named in the error. Every
    format's reader resolves tags through here, so none reads outside the directory it was given.
    """
    if (
        not tag
        or tag == LATEST
        or tag.startswith(".")
        or any(c in tag for c in "/\\\0")
        or os.path.isabs(tag)
    ):
        where = f" (named by {source})" if source else ""
        fix = f"write one into {source}" if source else "pass one"
        raise CheckpointPathError(
            f"checkpoint tag {tag!r}{where} is not usable as a directory name inside the "
            f"checkpoint directory; a tag is a plain name such as 'global_step100': {fix}"
        )
    return tag


def read_latest(directory: str) -> str | None:
    """The tag ``<directory>/latest`` names (checked with :func:`check_tag`); None without one."""
    path = os.path.join(directory, LATEST)
    try:
        with open(path, encoding="utf-8") as f:
            tag = f.read().strip()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    return check_tag(tag, path) if tag else None


def shard_file(rank: int, world_size: int) -> str:
    return f"shard-{rank:05d}-of-{world_size:05d}.bin"


def rank_objects_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def align_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


@dataclass(frozen=True)
class ShardEntry:
    """One contiguous piece of a logical tensor inside one shard file."""

    file: str
    offset: int  # first flat element of the logical tensor held here
    numel: int
    byte_offset: int  # where those elements start in ``file``

    @property
    def stop(self) -> int:
        return self.offset + self.numel

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "offset": self.offset,
            "numel": self.numel,
            "byte_offset": self.byte_offset,
        }


def encode_manifest(manifest: dict[str, Any]) -> bytes:
    """Deterministic encoding: equal manifests give equal bytes (async and sync saves compare)."""
    return (json.dumps(manifest, sort_keys=True, indent=1) + "\n").encode()


def decode_manifest(data: bytes, where: str) -> dict[str, Any]:
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise CheckpointError(
            f"manifest {where} is not valid JSON ({exc}); the checkpoint is damaged, "
            "load an earlier tag"
        ) from exc
    found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
    if found != FORMAT_NAME or not isinstance(manifest, dict):
        raise CheckpointError(f"{where} is not a ds sharded checkpoint manifest (format={found!r})")
    if int(manifest.get("format_version", 0)) > FORMAT_VERSION:
        raise CheckpointError(
            f"{where} uses format version {manifest['format_version']}, newer than this "
            f"ds-checkpoint-ledger reads ({FORMAT_VERSION}); upgrade ds-checkpoint-ledger"
        )
    out: dict[str, Any] = manifest
    return out
