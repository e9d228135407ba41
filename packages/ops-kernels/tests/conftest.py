"""Fixtures the kernel tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread for the test: the references are torch element-wise ops, and on a
    shared 2-core machine two intra-op threads spin against each other and run 20x slower than
    one. Tests of thread counts set their own."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
