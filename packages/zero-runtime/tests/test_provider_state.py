"""The CPU-offload optimizers take their state from the kernel provider (``new_state``), placed
apart from the master params and grads it is stepped with, and step exactly as on plain state."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ds.interfaces.kernels import KernelProvider
from ds.ops.placement import MIN_GAP, PERIOD
from ds.ops.provider import CpuKernelProvider
from ds.zero.optim.provider import ProviderAdagrad, ProviderAdam, ProviderLion

N = 1 << 20  # fp32 elements: 4 MiB buffers, large enough to be placed


class RecordingProvider(CpuKernelProvider):
    """The real CPU provider; also remembers what each state tensor was placed against."""

    def __init__(self) -> None:
        self.placed: dict[int, set[int]] = {}

    def new_state(self, like: torch.Tensor, avoid: Any = ()) -> torch.Tensor:
        out = super().new_state(like, avoid)
        self.placed[out.data_ptr()] = {t.data_ptr() for t in avoid}
        return out


def _dist(a: torch.Tensor, b: torch.Tensor) -> int:
    d = (a.data_ptr() - b.data_ptr()) % PERIOD
    return min(d, PERIOD - d)


@pytest.mark.parametrize(
    ("cls", "names"),
    [
        (ProviderAdam, ("exp_avg", "exp_avg_sq")),
        (ProviderLion, ("exp_avg",)),
        (ProviderAdagrad, ("sum",)),
    ],
)
def test_state_is_placed_apart_from_master_and_grad(cls: type, names: tuple[str, ...]) -> None:
    arena = torch.empty(2 * PERIOD + 8 * N, dtype=torch.uint8)
    start = (-arena.data_ptr()) % 64
    # Master partition and its grad congruent modulo PERIOD, the worst case for a lockstep walk.
    master = arena[start : start + 4 * N].view(torch.float32).normal_()
    grad = arena[start + PERIOD : start + PERIOD + 4 * N].view(torch.float32).normal_()
    p = master  # flat master buffers, as the engine hands them over: no autograd
    p.grad = grad
    ref = master.clone()
    ref.grad = grad.clone()
    kernels = RecordingProvider()
    assert isinstance(kernels, KernelProvider)
    opt, ref_opt = cls([p], kernels=kernels), cls([ref], kernels=CpuKernelProvider())
    for _ in range(2):
        opt.step()
        ref_opt.step()
    state = opt.state[p]
    for i, n in enumerate(names):
        want = {p.data_ptr(), grad.data_ptr()} | {state[m].data_ptr() for m in names[:i]}
        assert kernels.placed[state[n].data_ptr()] == want
        assert _dist(state[n], p) >= MIN_GAP and _dist(state[n], grad) >= MIN_GAP
        assert torch.equal(state[n], ref_opt.state[ref][n])
    assert torch.equal(p.detach(), ref.detach())
