"""``deepspeed.runtime.dataloader``: ``RepeatingLoader`` and ``DeepSpeedDataLoader``.

``DeepSpeedDataLoader`` is the loader class ``deepspeed.initialize(training_data=...)`` and
``engine.deepspeed_io`` return (ds's :class:`ds.zero.dataloader.ShardedLoader`, a DataLoader over a
DistributedSampler that reshuffles each epoch), so ``isinstance`` checks hold; constructing it with
DeepSpeed's arguments builds that loader."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


def _sharded() -> type:
    from ds.zero.dataloader import ShardedLoader

    return ShardedLoader


class RepeatingLoader:
    """Iterate ``loader`` forever: when it is exhausted a new pass starts (``iter(loader)`` again,
    so a sharded loader reshuffles for its next epoch). An empty loader raises StopIteration
    instead of looping."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader
        self.data_iter: Iterator[Any] = iter(loader)

    def __iter__(self) -> RepeatingLoader:
        return self

    def __next__(self) -> Any:
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)  # a second StopIteration: the loader yields nothing

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]


class _LoaderMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _sharded())

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _sharded())


class DeepSpeedDataLoader(metaclass=_LoaderMeta):
    """DeepSpeed's constructor; the object made (and the engine's loaders) is a ShardedLoader."""

    def __new__(  # type: ignore[misc]
        cls,
        dataset: Any,
        batch_size: int,
        pin_memory: bool = False,
        local_rank: int = 0,
        tput_timer: Any = None,
        collate_fn: Any = None,
        num_local_io_workers: int | None = None,
        data_sampler: Any = None,
        data_parallel_world_size: int | None = None,
        data_parallel_rank: int | None = None,
        dataloader_drop_last: bool = False,
        deepspeed_dataloader_config: dict[str, Any] | None = None,
    ) -> Any:
        if data_sampler is not None:
            raise ValueError(
                "DeepSpeedDataLoader(data_sampler=...): ds shards with its own DistributedSampler; "
                "build a torch DataLoader with your sampler instead"
            )
        from ds import comm

        initialized = comm.is_initialized()
        world = data_parallel_world_size or (comm.get_world_size() if initialized else 1)
        rank = (
            data_parallel_rank
            if data_parallel_rank is not None
            else (comm.get_rank() if initialized else 0)
        )
        return _sharded()(
            dataset, batch_size, rank, world, drop_last=dataloader_drop_last,
            collate_fn=collate_fn, num_workers=num_local_io_workers or 0,
        )  # fmt: skip


__all__ = ["DeepSpeedDataLoader", "RepeatingLoader"]
