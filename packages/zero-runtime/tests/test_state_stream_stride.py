"""The NVMe state stream's buffer sets hold a partition's master, exp_avg and exp_avg_sq a stride
apart that keeps the three from congruent addresses (which slow the step's lockstep walk), stays
4 KiB aligned, and round-trips the state through the swap file unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ds.zero.stage3.state_stream import KINDS, StateStream, view_stride
from ds.zero.stage3.swap import SwapFile

PERIOD, GAP = 32 << 20, 64 << 10


def _apart(a: int, b: int) -> bool:
    d = (a - b) % PERIOD
    return min(d, PERIOD - d) >= GAP


@pytest.mark.parametrize(
    "numel",
    [1, 1000, 1 << 20, (1 << 21) + 3, 1 << 22, 1 << 23, 3 << 23, 1 << 24, 1 << 26, 12345677],
)
def test_view_stride(numel: int) -> None:
    s = view_stride(numel)
    assert s >= numel and s % 1024 == 0
    assert s - numel < 1024 + 64 * 1024  # a little padding, never a second copy
    assert _apart(0, 4 * s) and _apart(0, 8 * s) and _apart(4 * s, 8 * s)


def test_stream_views_are_apart_and_state_round_trips(tmp_path: Path) -> None:
    from ds.ops.provider import CpuKernelProvider

    handle = CpuKernelProvider().aio_handle()
    try:
        swap = SwapFile(handle, str(tmp_path / "state.swp"))
        n = 1 << 23  # 32 MiB per view: one partition apart would be congruent modulo 32 MiB
        gen = torch.Generator().manual_seed(0)
        start = {k: torch.randn(n, generator=gen) for k in KINDS}
        for k in KINDS:
            swap.write(("p", k), start[k])
        seen: list[list[int]] = []

        def step(i: int, m: torch.Tensor, v: torch.Tensor, w: torch.Tensor) -> None:
            seen.append([m.data_ptr(), v.data_ptr(), w.data_ptr()])
            for k, t in zip(KINDS, (m, v, w), strict=True):
                assert torch.equal(t, start[k])
                t.add_(1.0)

        StateStream(swap, buffer_count=2).run([("p", n)], step)
        ((m, v, w),) = seen
        assert _apart(m, v) and _apart(m, w) and _apart(v, w)
        for k in KINDS:
            out = torch.empty(n)
            swap.read(("p", k), out)
            assert torch.equal(out, start[k] + 1.0)
    finally:
        handle.close()
