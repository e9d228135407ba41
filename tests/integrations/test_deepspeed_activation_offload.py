"""``deepspeed.runtime.activation_checkpointing.offload_activations``: while a context is active a
checkpointed transformers layer marks its hidden states for offload; the class is restored after
the last context, even on error; host buffers pin through the accelerator."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from ds.full.compat.deepspeed.runtime.activation_checkpointing.offload_activations import (
    CheckpointHiddenStatesOffload,
)

transformers = pytest.importorskip("transformers")


class _Layer(transformers.GradientCheckpointingLayer):  # type: ignore[misc,name-defined]
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states.sin() * 2


def test_marker_installed_while_active_and_restored() -> None:
    base = transformers.GradientCheckpointingLayer.__call__
    layer = _Layer()
    layer.gradient_checkpointing = True
    layer._gradient_checkpointing_func = partial(checkpoint, use_reentrant=False)
    x = torch.randn(3, 4, requires_grad=True)
    outer = CheckpointHiddenStatesOffload(use_streams=False, min_offload_bytes=0)
    with outer:
        with CheckpointHiddenStatesOffload(use_streams=False), pytest.raises(KeyError):
            raise KeyError("inner fails")
        assert transformers.GradientCheckpointingLayer.__call__ is not base
        layer(x).sum().backward()
    assert transformers.GradientCheckpointingLayer.__call__ is base
    assert outer.stats.marked_tensors == 1 and outer.stats.skipped_marked_tensors == 1
    torch.testing.assert_close(x.grad, 2 * x.detach().cos())


def test_host_buffer_pins_through_the_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    from ds.full.compat.deepspeed.accelerator import get_accelerator

    calls: list[bool] = []
    acc = get_accelerator()
    monkeypatch.setattr(acc, "pin_memory", lambda t, make_copy=True: calls.append(make_copy) or t)
    buf, _ = CheckpointHiddenStatesOffload()._empty_cpu_like(torch.randn(4, 6)[:, ::3])
    assert calls == [False] and buf.shape == (4, 2) and buf.is_contiguous()
