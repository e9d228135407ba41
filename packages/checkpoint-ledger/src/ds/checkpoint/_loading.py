"""The read side of :class:`ds.checkpoint.engine.ShardedCheckpointEngine`: find a checkpoint,
read its manifest, load requested ranges (resharding on read, DeepSpeed's own checkpoints
included) and re-hash its files.

Loading reads only: every file this rank reads is checked against the manifest's SHA-256 first and
pickles load weights-only. The engine records each load in its ledger and events.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ds.checkpoint import _format as fmt
from ds.checkpoint import _recovery, deepspeed_format
from ds.checkpoint._reader import FileCache, read_range, tensor_metas
from ds.checkpoint.safe_load import safe_torch_load, sha256_file, verify_files_read
from ds.interfaces.checkpoint import LoadRequest, ShardedStateDict, ShardedTensor, TensorMeta
from ds.interfaces.errors import CheckpointError
from ds.interfaces.logging import get_logger

log = get_logger(__name__)

_check_tag = fmt.check_tag


class CheckpointReading:
    """Loading and verifying, mixed into the engine (which gives ``rank``, ``world_size``, and
    the optional ``_ledger`` and ``_events``)."""

    _ledger: Any
    _events: Any

    @property
    def rank(self) -> int:
        raise NotImplementedError

    @property
    def world_size(self) -> int:
        raise NotImplementedError

    def latest_tag(self, directory: str) -> str | None:
        return fmt.read_latest(directory)

    def checkpoint_dir(self, directory: str, tag: str | None) -> str:
        if tag is None:
            tag = self.latest_tag(directory)
            if tag is None:
                raise CheckpointError(
                    f"no checkpoint in {directory} (no 'latest' file); pass a tag or save first"
                )
        _check_tag(tag)
        path = os.path.join(directory, tag)
        if not os.path.isdir(path):
            old = os.path.join(directory, f".old-{tag}")
            if os.path.isdir(old):  # a crash interrupted an overwrite between its two renames
                return old
            raise CheckpointError(f"checkpoint {tag!r} not found in {directory}")
        return path

    def manifest(self, directory: str, tag: str | None = None) -> dict[str, Any]:
        path = os.path.join(self.checkpoint_dir(directory, tag), fmt.MANIFEST)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError as exc:
            raise CheckpointError(f"{path} is missing; the checkpoint is incomplete") from exc
        return fmt.decode_manifest(data, path)

    def metadata(self, directory: str, tag: str | None = None) -> Mapping[str, TensorMeta]:
        if deepspeed_format.is_deepspeed_checkpoint(directory, tag):  # saved by DeepSpeed
            return deepspeed_format.open_checkpoint(directory, tag).metadata()
        return tensor_metas(self.manifest(directory, tag))

    def load(
        self,
        directory: str,
        tag: str | None,
        requests: Sequence[LoadRequest],
        *,
        rank_objects: bool = True,
        verify: bool = True,
    ) -> ShardedStateDict:
        """Read the requested ranges. With ``verify`` (the default) every file this rank reads is
        checked against the SHA-256 recorded in the manifest first; pickles load weights-only."""
        _recovery.require_load(self, directory, tag, requests)  # needs approvals
        if deepspeed_format.is_deepspeed_checkpoint(directory, tag):  # saved by DeepSpeed
            return deepspeed_format.open_checkpoint(directory, tag).load(requests)
        root = self.checkpoint_dir(directory, tag)
        manifest = self.manifest(directory, tag)
        metas = tensor_metas(manifest)
        out = ShardedStateDict()
        if verify:
            verify_files_read(root, manifest, requests, self.rank, rank_objects)
        files = FileCache(root)
        try:
            for req in requests:
                if req.name not in metas:
                    read_range(manifest, files, req.name, req.offset, req.numel)  # names the error
                local = read_range(manifest, files, req.name, req.offset, req.numel)
                out.tensors[req.name] = ShardedTensor(metas[req.name], req.offset, local)
        finally:
            files.close()
        out.objects = _load_pickle(os.path.join(root, fmt.OBJECTS))
        if rank_objects:
            if self.rank < int(manifest["world_size"]):
                out.rank_objects = _load_pickle(
                    os.path.join(root, fmt.rank_objects_file(self.rank))
                )
            else:
                log.warning(
                    "no per-rank objects for this rank: checkpoint written by fewer ranks",
                    rank=self.rank,
                    saved_world_size=manifest["world_size"],
                )
        step = out.objects.get("step", 0)
        step = int(step) if isinstance(step, int) else 0
        if self._ledger is not None and self.rank == 0:
            self._ledger.record_training_event(
                "checkpoint_load",
                {
                    "directory": os.path.abspath(directory),
                    "tag": manifest["tag"],
                    "step": step,
                    "saved_world_size": manifest["world_size"],
                    "world_size": self.world_size,
                    "manifest_sha256": sha256_file(os.path.join(root, fmt.MANIFEST)),
                },
            )
        if self._events is not None:
            from ds.interfaces.telemetry import CheckpointEvent

            self._events.publish(
                CheckpointEvent("load", os.path.abspath(directory), manifest["tag"], step)
            )
        return out

    def verify(self, directory: str, tag: str | None = None) -> list[str]:
        """Re-hash every file against the manifest; returns the problems found (empty = intact)."""
        root = self.checkpoint_dir(directory, tag)
        manifest = self.manifest(directory, tag)
        problems: list[str] = []
        for name, info in sorted(manifest["files"].items()):
            path = os.path.join(root, name)
            if not os.path.exists(path):
                problems.append(f"{name}: missing")
                continue
            size = os.path.getsize(path)
            if size != int(info["bytes"]):
                problems.append(f"{name}: {size} bytes on disk, manifest says {info['bytes']}")
                continue
            if info.get("sha256") and sha256_file(path) != info["sha256"]:
                problems.append(f"{name}: SHA-256 differs from the manifest (content changed)")
        return problems


def _load_pickle(path: str) -> dict[str, Any]:
    # weights_only: a checkpoint never runs code when loaded (hashes were checked by load()).
    return dict(safe_torch_load(path))


__all__ = ["CheckpointReading"]
