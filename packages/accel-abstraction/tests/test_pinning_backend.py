"""DS_PIN_MEMORY_BACKEND: the accelerator's pin_memory is where the pinned-memory backend is chosen."""

from __future__ import annotations

import pytest
import torch

from ds.accel.cpu import CpuAccelerator
from ds.accel.locked_host import lock_failure
from ds.accel.pinning import native_pinned_memory, pin_backend


def test_default_backend_leaves_cpu_tensors_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DS_PIN_MEMORY_BACKEND", raising=False)
    acc = CpuAccelerator()
    t = torch.ones(3)
    assert acc.pin_memory(t) is t and not acc.is_pinned(t)
    assert acc.unpin_memory(t) is False
    assert acc.capabilities().has_pinned_memory is False


def test_unknown_backend_warns_once_and_means_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_PIN_MEMORY_BACKEND", "cuda-host")
    with pytest.warns(UserWarning, match="not a pinned-memory backend"):
        assert pin_backend() == "torch"
    assert pin_backend() == "torch"


def test_native_backend_locks_and_unlocks_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    if (why := lock_failure()) is not None:
        pytest.skip(why)
    monkeypatch.setenv("DS_PIN_MEMORY_BACKEND", "native")
    acc = CpuAccelerator()
    assert acc.capabilities().has_pinned_memory is True
    src = torch.arange(6.0).view(2, 3)
    pinned = acc.pin_memory(src)
    assert torch.equal(pinned, src) and pinned.data_ptr() != src.data_ptr()
    assert acc.is_pinned(pinned[1]) and not acc.is_pinned(src)
    assert pinned.data_ptr() in native_pinned_memory()._ranges
    assert acc.unpin_memory(pinned) is True and not acc.is_pinned(pinned)
    assert acc.unpin_memory(pinned) is False
    assert torch.equal(pinned, src)  # unlocked, still readable
