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


def test_offloaded_stage2_places_master_grad_and_moments() -> None:
    # A ZeRO-2 engine with CPU optimizer offload: the master partition's grad and both moments
    # come from the provider, each placed apart from what it is walked with.
    from ds.zero.engine import ZeroEngine

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 4))
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
    }
    kernels = RecordingProvider()
    engine = ZeroEngine(model, cfg, kernels=kernels)
    group = engine.strategy.groups[0]  # type: ignore[attr-defined]
    master, grad = group.master, group.master_grad
    assert kernels.placed[grad.data_ptr()] == {master.data_ptr()}
    engine.backward(engine(torch.randn(2, 1024)).pow(2).mean())
    engine.step()
    state = engine.strategy.optimizer.state[master]  # type: ignore[attr-defined]
    m, v = state["exp_avg"], state["exp_avg_sq"]
    assert kernels.placed[m.data_ptr()] == {master.data_ptr(), grad.data_ptr()}
    assert kernels.placed[v.data_ptr()] == {master.data_ptr(), grad.data_ptr(), m.data_ptr()}
    for a, b in [(master, grad), (master, m), (master, v), (grad, m), (grad, v), (m, v)]:
        assert _dist(a, b) >= MIN_GAP


@pytest.mark.parametrize("stage", [1, 2])
def test_offload_with_one_backward_per_step_holds_no_extra_gradient_buffer(stage: int) -> None:
    # ZeRO-1/2 with CPU optimizer offload and one backward per step: the host keeps the fp32
    # gradient partition the optimizer steps with and nothing beside it (no second host buffer
    # to accumulate micro-batches into), the same gradient bytes as without offload, every step.
    from ds.zero.engine import ZeroEngine

    def run(offload: bool) -> tuple[list[int], list[torch.Tensor]]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
        zero: dict[str, Any] = {"stage": stage, "reduce_bucket_size": 200}
        if offload:
            zero["offload_optimizer"] = {"device": "cpu"}
        cfg = {
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 1,
            "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": zero,
        }
        engine = ZeroEngine(model, cfg, kernels=CpuKernelProvider())
        g = torch.Generator().manual_seed(1)
        held = []
        for _ in range(3):
            x = torch.randn(2, 16, generator=g).to(torch.bfloat16)
            engine.backward(engine(x).float().pow(2).mean())
            engine.step()
            held.append(engine.memory_report().gradient_bytes)
        weights = [p.detach().float().clone() for p in engine.module.parameters()]
        engine.destroy()
        return held, weights

    numel = 16 * 32 + 32 + 32 * 4 + 4
    (offloaded, w_off), (on_device, w_dev) = run(True), run(False)
    assert offloaded == on_device == [4 * numel] * 3  # the fp32 gradient of the one partition
    for a, b in zip(w_off, w_dev, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-2)  # bf16 weights, same updates
