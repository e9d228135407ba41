"""``deepspeed.utils.RepeatingLoader``, ``deepspeed.runtime.utils.set_random_seed`` and
``deepspeed.runtime.dataloader.DeepSpeedDataLoader`` on real torch loaders."""

from __future__ import annotations

import random

import numpy
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset


def test_repeating_loader_restarts_a_dataloader_each_pass() -> None:
    from ds.full.compat.deepspeed.runtime.dataloader import RepeatingLoader as FromRuntime
    from ds.full.compat.deepspeed.utils import RepeatingLoader

    assert RepeatingLoader is FromRuntime
    loader = DataLoader(TensorDataset(torch.arange(5)), batch_size=2)
    it = iter(RepeatingLoader(loader))
    got = [next(it)[0].tolist() for _ in range(7)]
    assert got == [[0, 1], [2, 3], [4], [0, 1], [2, 3], [4], [0, 1]]
    assert len(RepeatingLoader(loader)) == 3
    with pytest.raises(StopIteration):
        next(RepeatingLoader([]))  # an empty loader ends instead of looping forever


def test_set_random_seed_seeds_python_numpy_and_torch() -> None:
    from ds.full.compat.deepspeed.runtime.utils import set_random_seed
    from ds.full.compat.deepspeed.utils import set_random_seed as from_utils

    assert from_utils is set_random_seed

    def draw() -> tuple[float, float, list[float]]:
        return random.random(), float(numpy.random.rand()), torch.rand(3).tolist()

    set_random_seed(1138)
    first = draw()
    set_random_seed(1138)
    assert draw() == first
    set_random_seed(7)
    assert draw() != first
    set_random_seed(2**64 + 5)  # larger than numpy and torch accept: reduced, as DeepSpeed does
    a = draw()
    set_random_seed(2**64 + 5)
    assert draw() == a


def test_deepspeed_data_loader_is_the_engine_loader_class() -> None:
    from ds.full.compat.deepspeed.runtime.dataloader import DeepSpeedDataLoader
    from ds.zero.dataloader import ShardedLoader

    data = TensorDataset(torch.arange(10))
    loader = DeepSpeedDataLoader(
        data, batch_size=2, pin_memory=False, local_rank=0, tput_timer=None,
        data_parallel_world_size=2, data_parallel_rank=1,
    )  # fmt: skip
    assert isinstance(loader, ShardedLoader) and isinstance(loader, DeepSpeedDataLoader)
    assert issubclass(ShardedLoader, DeepSpeedDataLoader)
    seen = sorted(int(x) for (batch,) in loader for x in batch)
    assert len(seen) == 5  # rank 1 of 2 reads half the samples
    with pytest.raises(ValueError, match="data_sampler"):
        DeepSpeedDataLoader(data, 2, False, 0, None, data_sampler=object())
