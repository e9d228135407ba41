"""mlock'ed host tensors: locked pages show in /proc's VmLck, views are recognised, the memory
outlives an early unlock while a view uses it, and is returned with its last view."""

from __future__ import annotations

import gc
import re
from pathlib import Path

import pytest
import torch

from ds.accel.locked_host import LockedHostMemory, lock_failure


@pytest.fixture(autouse=True)
def _can_lock() -> None:
    if (why := lock_failure()) is not None:  # a memlock limit too low for the test
        pytest.skip(why)


def _locked_kib() -> int:
    m = re.search(r"VmLck:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return int(m.group(1)) if m else 0


def test_alloc_locks_pages_and_views_are_recognised() -> None:
    mem = LockedHostMemory()
    before = _locked_kib()
    t = mem.alloc(4096, torch.float32)  # 16 KiB
    assert _locked_kib() - before >= 16
    assert t.shape == (4096,) and t.dtype == torch.float32 and not t.any()
    assert mem.contains(t) and mem.contains(t[100:200]) and mem.start_of(t[5:]) == t.data_ptr()
    assert not mem.contains(torch.empty(4096)) and not mem.contains(torch.empty(2, device="meta"))
    assert mem.unlock(t.data_ptr()) and not mem.contains(t)
    assert _locked_kib() == before
    assert not mem.unlock(t.data_ptr())


def test_memory_lives_until_last_view_is_gone() -> None:
    mem = LockedHostMemory()
    t = mem.alloc(64, torch.float64)
    t.copy_(torch.arange(64.0, dtype=torch.float64))
    begin, view = t.data_ptr(), t[8:16]
    del t
    gc.collect()
    assert begin in mem.ranges and float(view[0]) == 8.0
    del view
    gc.collect()
    assert begin not in mem.ranges
