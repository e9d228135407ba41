"""The loader ``initialize(training_data=...)`` returns: each rank reads its own share."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, Dataset, DistributedSampler


class ShardedLoader:
    """A DataLoader over a DistributedSampler; a new epoch reshuffles (``seed + epoch``)."""

    def __init__(
        self,
        dataset: Dataset[Any],
        batch_size: int,
        rank: int,
        world_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
    ) -> None:
        self.sampler = DistributedSampler(
            dataset,
            num_replicas=world_size,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=self.sampler,
            collate_fn=collate_fn,
            num_workers=num_workers,
            drop_last=drop_last,
        )
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        self.sampler.set_epoch(self.epoch)
        self.epoch += 1
        return iter(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
