"""``CIFAR10``: 64 random 32x32 RGB images (HWC uint8) and labels, no download."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class CIFAR10(torch.utils.data.Dataset):  # type: ignore[type-arg]
    SIZE = 64

    def __init__(
        self, root: str, train: bool = True, download: bool = False,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:  # fmt: skip
        g = torch.Generator().manual_seed(0 if train else 1)
        self.data = torch.randint(0, 256, (self.SIZE, 32, 32, 3), dtype=torch.uint8, generator=g)
        self.targets = torch.randint(0, 10, (self.SIZE,), generator=g).tolist()
        self.transform = transform

    def __len__(self) -> int:
        return self.SIZE

    def __getitem__(self, i: int) -> tuple[Any, int]:
        img = self.data[i]
        return (self.transform(img) if self.transform else img), self.targets[i]
