"""A checkpoint engine for the simulated GPU world: the save/load contract without bytes.

Fake tensors have no values to write, so under :func:`ds.sim.world.run_world` the ``default``
checkpoint engine is this one. It keeps, per directory and tag, what every rank handed over
(each tensor's metadata and the element ranges each rank saved, the objects, each rank's own
objects) in memory shared by the world's ranks, and checks what a real engine relies on:

* a shard lies on the host or on the saving rank's own device, inside its logical tensor;
* every rank describes a logical tensor with the same shape and dtype;
* every load request is covered by ranges saved so far (ranks run one after another, so a rank
  reloading its own partition is covered; resharding across world sizes is the gloo tests' job).

Loaded shards are host tensors of the requested size and dtype (fake, so without values).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ds.interfaces.checkpoint import LoadRequest, ShardedStateDict, ShardedTensor, TensorMeta
from ds.interfaces.errors import CheckpointError


@dataclass
class _Saved:
    meta: dict[str, TensorMeta] = field(default_factory=dict)
    ranges: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    objects: dict[int, dict[str, Any]] = field(default_factory=dict)
    rank_objects: dict[int, dict[str, Any]] = field(default_factory=dict)


class SimCheckpointStore:
    """What the world's ranks saved, by (directory, tag)."""

    def __init__(self) -> None:
        self.saved: dict[tuple[str, str], _Saved] = {}
        self.latest: dict[str, str] = {}


class _Done:
    def wait(self) -> None:
        return None

    def done(self) -> bool:
        return True


class SimCheckpointEngine:
    def __init__(self, store: SimCheckpointStore, comm: Any, **_: Any) -> None:
        self.store = store
        self.comm = comm

    @property
    def _rank(self) -> int:
        return int(self.comm.get_rank()) if self.comm is not None else 0

    def _device(self) -> torch.device | None:
        return getattr(self.comm, "device", None)

    def save(
        self, directory: str, tag: str, state: ShardedStateDict, *, async_save: bool = False
    ) -> _Done:
        saved = self.store.saved.setdefault((directory, tag), _Saved())
        rank, own = self._rank, self._device()
        for name, shard in state.tensors.items():
            local = shard.local
            if local.device.type != "cpu" and local.device != own:
                raise CheckpointError(
                    f"rank {rank} saves {name} from {local.device}; a shard lives on the host or "
                    f"on the rank's own device ({own})"
                )
            if shard.offset < 0 or shard.offset + local.numel() > shard.meta.numel:
                raise CheckpointError(
                    f"rank {rank} saves elements [{shard.offset}, {shard.offset + local.numel()})"
                    f" of {name}, which has {shard.meta.numel}"
                )
            known = saved.meta.setdefault(name, shard.meta)
            if (known.shape, known.dtype) != (shard.meta.shape, shard.meta.dtype):
                raise CheckpointError(
                    f"rank {rank} describes {name} as {shard.meta.dtype}{list(shard.meta.shape)}"
                    f" where another rank saved {known.dtype}{list(known.shape)}"
                )
            saved.ranges.setdefault(name, []).append((shard.offset, shard.offset + local.numel()))
        saved.objects[rank] = dict(state.objects)
        saved.rank_objects[rank] = dict(state.rank_objects)
        self.store.latest[directory] = tag
        return _Done()

    def _saved(self, directory: str, tag: str | None) -> _Saved:
        tag = tag or self.latest_tag(directory)
        found = self.store.saved.get((directory, tag or ""))
        if found is None:
            raise CheckpointError(f"no simulated checkpoint {tag!r} in {directory}")
        return found

    def load(
        self,
        directory: str,
        tag: str | None,
        requests: Sequence[LoadRequest],
        *,
        rank_objects: bool = True,
    ) -> ShardedStateDict:
        saved = self._saved(directory, tag)
        rank = self._rank
        out = ShardedStateDict()
        for req in requests:
            meta = saved.meta.get(req.name)
            if meta is None:
                raise CheckpointError(f"rank {rank} asks for {req.name}, which was not saved")
            if not _covered(saved.ranges[req.name], req.offset, req.offset + req.numel):
                raise CheckpointError(
                    f"rank {rank} asks for elements [{req.offset}, {req.offset + req.numel}) of "
                    f"{req.name}, which no rank saved"
                )
            local = torch.empty(req.numel, dtype=getattr(torch, meta.dtype))
            out.tensors[req.name] = ShardedTensor(meta, req.offset, local)
        objects = saved.objects.get(rank) or next(iter(saved.objects.values()), {})
        out.objects.update(objects)
        if rank_objects:
            out.rank_objects.update(saved.rank_objects.get(rank, {}))
        return out

    def latest_tag(self, directory: str) -> str | None:
        return self.store.latest.get(directory)

    def metadata(self, directory: str, tag: str | None = None) -> Mapping[str, TensorMeta]:
        return dict(self._saved(directory, tag).meta)

    def wait(self) -> None:
        return None


def _covered(ranges: list[tuple[int, int]], lo: int, hi: int) -> bool:
    pos = lo
    for a, b in sorted(ranges):
        if a > pos:
            break
        pos = max(pos, b)
        if pos >= hi:
            return True
    return pos >= hi


__all__ = ["SimCheckpointEngine", "SimCheckpointStore"]
