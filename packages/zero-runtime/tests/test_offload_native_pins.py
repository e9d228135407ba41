"""CPU-offload host buffers pinned through the accelerator: with DS_PIN_MEMORY_BACKEND=native the
offloaded fp32 masters are mlock'ed (ds.accel.pinning) and ``destroy()`` unlocks them; the default
backend on the CPU pins nothing. Pinning never changes the arithmetic: both runs match bit for bit."""

from __future__ import annotations

import pytest
import torch

from ds.accel import get_accelerator
from ds.accel.locked_host import lock_failure
from ds.accel.pinning import native_pinned_memory
from ds.ops.provider import CpuKernelProvider
from ds.zero.engine import ZeroEngine


@pytest.fixture(autouse=True)
def _can_lock() -> None:
    if (why := lock_failure()) is not None:  # a memlock limit too low for the test
        pytest.skip(why)


def _engine(stage: int) -> ZeroEngine:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
        "zero_optimization": {
            "stage": stage,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
        },
    }
    return ZeroEngine(model, cfg, kernels=CpuKernelProvider(), accelerator=get_accelerator())


def _masters(engine: ZeroEngine) -> list[torch.Tensor]:
    return [p for g in engine.strategy.optimizer.param_groups for p in g["params"]]


def _train(engine: ZeroEngine) -> list[torch.Tensor]:
    torch.manual_seed(1)
    for _ in range(2):
        engine.backward(engine(torch.randn(4, 6)).pow(2).mean())
        engine.step()
    engine.synchronize_parameters()
    return [p.detach().clone() for p in engine.module.parameters()]


@pytest.mark.parametrize("stage", [2, 3])
def test_native_backend_pins_masters_and_destroy_releases_them(
    stage: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DS_PIN_MEMORY_BACKEND", raising=False)
    pins = native_pinned_memory()
    plain = _engine(stage)
    assert not any(get_accelerator().is_pinned(m) for m in _masters(plain))
    reference = _train(plain)
    plain.destroy()

    monkeypatch.setenv("DS_PIN_MEMORY_BACKEND", "native")
    before = set(pins._ranges)
    engine = _engine(stage)
    masters = _masters(engine)
    assert masters and all(get_accelerator().is_pinned(m) for m in masters)
    assert set(pins._ranges) - before
    trained = _train(engine)
    for a, b in zip(trained, reference):
        assert torch.equal(a, b)  # pinning moves no arithmetic: exact
    engine.destroy()
    assert set(pins._ranges) <= before
    assert not any(pins.is_pinned(m) for m in masters)
    assert torch.isfinite(masters[0]).all()  # unlocked, not freed: the tensor stays readable
