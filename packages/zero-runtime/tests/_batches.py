"""The fixed regression batches the one-process engine tests train on (the 6-in, 3-out models)."""

from __future__ import annotations

from collections.abc import Iterator

import torch


def regression_batches(n: int, seed: int = 1) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` batches ``(x, y)`` of four rows, ``x`` of 6 and ``y`` of 3 features, drawn in turn
    from one generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        yield torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
