"""Offloading marked checkpoint inputs: what is offloaded, kept or passed through, gradients equal
to the plain run, pooled dense host buffers; the round trip through the host runs on a GPU."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from ds.zero.activation_checkpointing.offload import MarkedActivationOffload


def _stack(
    layers: torch.nn.ModuleList, x: torch.Tensor, off: MarkedActivationOffload | None
) -> torch.Tensor:
    h = x
    for layer in layers:
        if off is not None:
            off.mark(h)
        h = checkpoint(layer, h, use_reentrant=False)
    return h.square().sum()


def _grads(layers: torch.nn.ModuleList) -> list[torch.Tensor]:
    return [p.grad.clone() for p in layers.parameters()]  # type: ignore[union-attr]


def _run(
    device: str, keep_last: int
) -> tuple[MarkedActivationOffload, list[torch.Tensor], list[torch.Tensor]]:
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4)).to(device)
    x = torch.randn(8, 16, device=device, requires_grad=True)
    _stack(layers, x, None).backward()
    expected = _grads(layers)
    layers.zero_grad()
    off = MarkedActivationOffload(
        use_pin_memory=False, min_offload_bytes=0, keep_last_count=keep_last
    )
    with off:
        _stack(layers, x, off).backward()
    return off, expected, _grads(layers)


def test_host_tensors_are_marked_but_never_offloaded() -> None:
    off, expected, got = _run("cpu", keep_last=1)
    assert off.stats.marked_tensors == 4 and off.stats.skipped_marked_tensors == 4
    assert off.stats.offloaded_tensors == 0 and off.stats.saved_tensors_seen > 4
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


def test_host_buffers_are_dense_pooled_and_pinned_through_the_hook() -> None:
    pinned: list[torch.Size] = []
    off = MarkedActivationOffload(pin=lambda t: pinned.append(t.shape) or t)
    strided = torch.randn(6, 8)[:, ::2]
    buf, key = off.host_buffer(strided)
    assert buf.is_contiguous() and buf.shape == strided.shape and pinned == [strided.shape]
    assert key == off.buffer_key(torch.empty(6, 4))
    off._give_back(key, buf)
    assert off.host_buffer(torch.empty(6, 4))[0] is buf and len(pinned) == 1


def test_arguments_and_reentry_are_checked() -> None:
    with pytest.raises(ValueError, match="keep_last_count"):
        MarkedActivationOffload(keep_last_count=-1)
    off = MarkedActivationOffload()
    with off, pytest.raises(RuntimeError, match="not re-entrant"):
        off.__enter__()


@pytest.mark.gpu
@pytest.mark.parametrize("keep_last", [0, 2])
def test_round_trip_through_host_matches_plain_run(keep_last: int) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device; none is visible on this machine")
    off, expected, got = _run("cuda", keep_last)
    assert off.stats.offloaded_tensors == 4 - keep_last
    assert off.stats.restored_tensors == 4 - keep_last and off.stats.kept_last_tensors == keep_last
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
