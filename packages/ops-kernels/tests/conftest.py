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


def _simd_levels() -> list[str]:
    from ds.ops import _C

    return [lvl for lvl in _C.simd_levels_built().split(",") if lvl]


@pytest.fixture(params=_simd_levels())
def simd_level(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs the test once per SIMD variant this build holds (skipped where the CPU cannot run
    it), with the native kernels dispatching to that variant."""
    from ds.ops import _C

    before = _C.simd_level()
    if not _C.set_simd_level(request.param):
        pytest.skip(f"this CPU cannot run the {request.param} variant")
    try:
        yield request.param
    finally:
        _C.set_simd_level(before)
