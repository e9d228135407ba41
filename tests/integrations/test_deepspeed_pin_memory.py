"""``deepspeed`` pinning: ``DS_PIN_MEMORY_BACKEND=native`` pins through mlock'ed pages
(ds.accel.locked_host) via the accelerator, the pin_memory op handle, and the running total."""

from __future__ import annotations

import pytest
import torch

from ds.accel.locked_host import lock_failure


@pytest.fixture(autouse=True)
def _can_lock() -> None:
    if (why := lock_failure()) is not None:  # a memlock limit too low for the test
        pytest.skip(why)


def test_accelerator_pins_natively_when_selected(monkeypatch: pytest.MonkeyPatch) -> None:
    from ds.full.compat.deepspeed.accelerator import get_accelerator
    from ds.full.compat.deepspeed.utils import pin_memory, pin_memory_tracker

    acc = get_accelerator()
    monkeypatch.delenv("DS_PIN_MEMORY_BACKEND", raising=False)
    assert pin_memory.get_active_native_pinned_memory() is None
    assert acc.unpin_memory(acc.pin_memory(torch.ones(3))) is None
    monkeypatch.setenv("DS_PIN_MEMORY_BACKEND", "native")
    pin_memory_tracker._tracker.reset()
    src = torch.arange(12.0).view(3, 4)
    pinned = acc.pin_memory(src)
    assert torch.equal(pinned, src) and pinned.ds_pinned and acc.is_pinned(pinned[1])
    assert pin_memory_tracker._tracker._bytes == 48
    scratch = acc.pin_empty(2, 5, dtype=torch.bfloat16)
    assert scratch.shape == (2, 5) and acc.is_pinned(scratch)
    assert acc.unpin_memory(pinned) is True and not acc.is_pinned(pinned[1])
    with pytest.raises(ValueError, match="host"):
        acc.pin_empty(4, dtype=torch.float32, device="meta")


def test_pin_memory_op_handle() -> None:
    from ds.full.compat.deepspeed.ops.op_builder import PinMemoryBuilder

    handle = PinMemoryBuilder().load().pin_handle()
    t = handle.new_cpu_locked_tensor(1024, torch.empty(0, dtype=torch.int16))
    assert t.dtype == torch.int16 and handle.is_pinned(t[10:20])
    assert handle.free_cpu_locked_tensor(t) is True and not handle.is_pinned(t)


def test_tracker_formats_and_milestones() -> None:
    from ds.full.compat.deepspeed.utils.pin_memory_tracker import _fmt_bytes, _tracker

    assert [_fmt_bytes(n) for n in (10, 3 << 10, 5 << 20)] == ["10 B", "3.0 KB", "5.00 MB"]
    _tracker.reset()
    _tracker.track(70 << 30)
    assert _tracker._next_checkpoint == 128 << 30
    _tracker.reset()


def test_native_backend_fails_early_when_the_pin_memory_op_does_not_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Selecting native pinning with no pin_memory op is an error, not a silent torch fallback."""
    from ds.full.compat.deepspeed.ops import op_builder
    from ds.full.compat.deepspeed.utils import pin_memory

    class _Broken:
        def load(self) -> None:
            raise OSError("no locked pages here")

    monkeypatch.setenv("DS_PIN_MEMORY_BACKEND", "native")
    monkeypatch.setattr(pin_memory, "_shared_native_pins", None)
    monkeypatch.setattr(op_builder, "PinMemoryBuilder", _Broken)
    with pytest.raises(RuntimeError, match=r"pin_memory op.*no locked pages here"):
        pin_memory.get_active_native_pinned_memory()
    monkeypatch.undo()
    monkeypatch.setenv("DS_PIN_MEMORY_BACKEND", "native")
    assert pin_memory.get_active_native_pinned_memory() is pin_memory.get_native_pinned_memory()
