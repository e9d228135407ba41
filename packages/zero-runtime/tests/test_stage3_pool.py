"""The stage-3 buffer pool: reuse, never reusing storage that is still referenced, the budget."""

from __future__ import annotations

import torch

from ds.zero.stage3.pool import BufferPool

CPU = torch.device("cpu")


def _returned(pool: BufferPool, numel: int) -> int:
    """Take a buffer of ``numel`` floats, drop it and give it back; its data pointer."""
    buf = pool.take(numel, torch.float32, CPU)
    ptr = buf.data_ptr()
    del buf
    pool.give(ptr)
    return ptr


def test_returned_buffer_is_reused_for_the_same_size() -> None:
    pool = BufferPool(budget_bytes=1 << 20)
    ptr = _returned(pool, 5000)
    b = pool.take(5000, torch.float32, CPU)
    assert b.data_ptr() == ptr and b.numel() == 5000
    assert pool.stats.fresh == 1 and pool.stats.reused == 1


def test_buffer_still_viewed_is_not_handed_out_until_released() -> None:
    pool = BufferPool(budget_bytes=1 << 20)
    a = pool.take(4096, torch.float32, CPU)
    ptr = a.data_ptr()
    saved = a[:10].view(2, 5)  # e.g. a tensor autograd saved from a gathered parameter
    saved.fill_(7.0)
    del a
    pool.give(ptr)
    b = pool.take(4096, torch.float32, CPU)
    assert b.data_ptr() != ptr  # the viewed buffer was not reused
    b.fill_(0.0)
    assert torch.equal(saved, torch.full((2, 5), 7.0))
    del saved
    c = pool.take(4096, torch.float32, CPU)
    assert c.data_ptr() == ptr  # reused once the view is gone


def test_idle_buffers_beyond_the_budget_are_freed() -> None:
    pool = BufferPool(budget_bytes=3 * 4096 * 4)
    bufs = [pool.take(4096, torch.float32, CPU) for _ in range(5)]
    ptrs = [b.data_ptr() for b in bufs]
    del bufs
    for p in ptrs:
        pool.give(p)
    assert pool.stats.free_bytes <= pool.budget_bytes
    assert pool.stats.dropped == 2
    assert pool.stats.allocated_bytes == 3 * 4096 * 4
    pool.clear()
    assert pool.stats.allocated_bytes == 0 and pool.stats.free_bytes == 0


def test_small_request_does_not_take_a_much_larger_buffer() -> None:
    pool = BufferPool(budget_bytes=1 << 24)
    ptr = _returned(pool, 100_000)
    small = pool.take(1000, torch.float32, CPU)
    assert small.data_ptr() != ptr
    mid = pool.take(60_000, torch.float32, CPU)
    assert mid.data_ptr() == ptr and mid.numel() == 60_000


def test_zero_budget_returns_without_waiting_for_other_holders() -> None:
    """With no idle budget (host memory) a returned buffer is simply released: no settle wait
    and no deferral even while another tensor still views it."""
    import time

    pool = BufferPool(budget_bytes=0)
    a = pool.take(4096, torch.float32, CPU)
    view = a[:10]  # another holder, like a collective's work object
    ptr = a.data_ptr()
    del a
    t = time.perf_counter()
    pool.give(ptr, settle_s=5.0)
    assert time.perf_counter() - t < 1.0
    assert pool.stats.deferred == 0 and pool.stats.dropped == 1
    assert pool.stats.allocated_bytes == 0 and pool.stats.free_bytes == 0
    assert view.numel() == 10
