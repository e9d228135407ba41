"""Durability helpers: fsync of files and directories, atomic small-file replacement."""

from __future__ import annotations

import os


def fsync_path(path: str) -> None:
    """fsync a file or a directory by path (directories make renames and creations durable)."""
    flags = os.O_RDONLY
    if hasattr(os, "O_DIRECTORY") and os.path.isdir(path):
        flags |= os.O_DIRECTORY
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` so a reader sees either the old or the new content, never a mix."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(os.path.dirname(os.path.abspath(path)))
