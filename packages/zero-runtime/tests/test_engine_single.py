"""The engine in one process: accumulation boundaries, no_sync, accessors, telemetry, errors."""

from __future__ import annotations

import copy

import pytest
import torch

from ds.interfaces.errors import ProviderNotFoundError
from ds.interfaces.telemetry import StepMetrics
from ds.interfaces.training import TrainingEngine
from ds.zero.engine import ZeroEngine


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))


def _cfg(stage: int, **kw: object) -> dict[str, object]:
    return {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 50},
        **kw,
    }


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_accumulation_matches_one_big_batch(stage: int) -> None:
    model = _model()
    ref = copy.deepcopy(model)
    engine = ZeroEngine(model, _cfg(stage, gradient_accumulation_steps=3))
    assert isinstance(engine, TrainingEngine)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.0, foreach=False)
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        x, y = torch.randn(12, 6, generator=g), torch.randn(12, 3, generator=g)
        for k in range(3):
            assert engine.is_gradient_accumulation_boundary() == (k == 2)
            loss = torch.nn.functional.mse_loss(engine(x[4 * k : 4 * k + 4]), y[4 * k : 4 * k + 4])
            engine.backward(loss)
            engine.step()
        opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
    assert engine.global_steps == 4 and engine.micro_steps == 12
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("stage", [0, 1])
def test_no_sync_accumulates_then_reduces(stage: int) -> None:
    model, ref = _model(), _model()
    engine = ZeroEngine(model, _cfg(stage, gradient_accumulation_steps=2))
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.0, foreach=False)
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    with engine.no_sync():
        engine.backward(torch.nn.functional.mse_loss(engine(x[:4]), y[:4]))
    engine.step()
    second = torch.nn.functional.mse_loss(engine(x[4:]), y[4:])
    torch.testing.assert_close(engine.backward(second), second / 2)  # over the 2 micro-steps
    engine.step()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    opt.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_accessors_and_telemetry() -> None:
    engine = ZeroEngine(
        _model(), _cfg(1, gradient_clipping=0.5, steps_per_print=1, wall_clock_breakdown=True)
    )
    seen: list[StepMetrics] = []
    engine.events.subscribe(seen.append, StepMetrics)
    assert engine.train_batch_size() == 4 and engine.train_micro_batch_size_per_gpu() == 4
    assert engine.gradient_accumulation_steps() == 1 and engine.zero_optimization_stage() == 1
    assert engine.get_lr() == [1e-2] and engine.gradient_clipping() == 0.5
    loss = engine(torch.randn(4, 6)).pow(2).mean()
    assert engine.backward(loss) is loss  # the loss over the accumulation steps (here 1)
    engine.step()
    assert len(seen) == 1
    m = seen[0]
    assert m.step == 1 and m.loss == pytest.approx(float(loss.detach())) and m.samples == 4
    assert m.grad_norm is not None and m.grad_norm > 0
    assert m.step_time_s > 0 and m.peak_host_rss_bytes > 0 and not m.overflow


def test_offload_without_a_kernel_provider_names_the_distribution() -> None:
    cfg = _cfg(2, zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}})
    with pytest.raises(ProviderNotFoundError, match="ds-ops-kernels"):
        ZeroEngine(_model(), cfg, kernels=None)


def test_optimizer_sources_are_exclusive() -> None:
    # Both: the client's optimizer is stepped and the section ignored, as DeepSpeed does.
    other = _model()
    with pytest.warns(UserWarning, match=r"config.optimizer \(adamw\) is ignored"):
        engine = ZeroEngine(other, _cfg(0), optimizer=torch.optim.SGD(other.parameters(), lr=0.1))
    assert isinstance(engine.optimizer, torch.optim.SGD)


def test_checkpoint_needs_an_engine() -> None:
    engine = ZeroEngine(_model(), _cfg(0))
    with pytest.raises(ProviderNotFoundError, match="checkpoint"):
        engine.save_checkpoint("/tmp/nowhere")


def test_bf16_keeps_fp32_master_weights() -> None:
    engine = ZeroEngine(_model(), _cfg(2, bf16={"enabled": True}))
    assert next(engine.module.parameters()).dtype == torch.bfloat16
    report = engine.memory_report()
    assert report.master_weight_bytes == 4 * sum(p.numel() for p in engine.module.parameters())
    engine.backward(engine(torch.randn(4, 6, dtype=torch.bfloat16)).float().pow(2).mean())
    engine.step()
    assert engine.global_steps == 1


def test_module_pass_throughs() -> None:
    engine = ZeroEngine(_model(), _cfg(2))
    assert engine.eval() is engine and not engine.module.training
    engine.train()
    assert engine.module.training
    assert [n for n, _ in engine.named_parameters()] == [
        n for n, _ in engine.module.named_parameters()
    ]
    assert len(list(engine.parameters())) == 4
    assert engine.module_state_dict().keys() == engine.module.state_dict().keys()
    with engine.coalesce_grad_reduction():
        engine.backward(engine(torch.randn(4, 6)).pow(2).mean())
        assert any(p.grad is not None for p in engine.parameters())  # held until the block ends
        engine.zero_grad()
        assert all(p.grad is None for p in engine.parameters())


def _offload_engine(device: str) -> ZeroEngine:
    from ds.accel import get_accelerator
    from ds.ops.provider import CpuKernelProvider

    offload = {"device": "cpu", "pin_memory": True}
    cfg = _cfg(2, zero_optimization={"stage": 2, "offload_optimizer": offload})
    model = _model().to(device)
    return ZeroEngine(model, cfg, kernels=CpuKernelProvider(), accelerator=get_accelerator())


def test_offloaded_master_stays_unpinned_on_a_cpu_model() -> None:
    engine = _offload_engine("cpu")
    master = engine.strategy.groups[0].master  # type: ignore[attr-defined]
    assert master.device.type == "cpu" and not master.is_pinned()
    engine.backward(engine(torch.randn(4, 6)).pow(2).mean())
    engine.step()
    assert engine.global_steps == 1


@pytest.mark.gpu
def test_offloaded_master_is_pinned_for_an_accelerator_model() -> None:
    engine = _offload_engine("cuda")
    master = engine.strategy.groups[0].master  # type: ignore[attr-defined]
    assert master.device.type == "cpu" and master.is_pinned()
    x = torch.randn(4, 6, device="cuda")
    before = [p.detach().clone() for p in engine.module.parameters()]
    engine.backward(engine(x).pow(2).mean())
    engine.step()
    engine.synchronize_parameters()
    after = list(engine.module.parameters())
    assert all(not torch.equal(a, b) for a, b in zip(after, before))


def test_optimizer_view_shares_groups_and_leaves_stepping_to_the_engine() -> None:
    engine = ZeroEngine(_model(), _cfg(1))
    view = engine.optimizer_view()
    assert isinstance(view, torch.optim.Optimizer)
    view.param_groups[0]["lr"] = 0.5  # what an LR scheduler does through the framework
    assert engine.get_lr() == [0.5]
    before = [p.detach().clone() for p in engine.module.parameters()]
    engine.backward(engine(torch.randn(4, 6)).pow(2).mean())
    assert view.step(lambda: 7) == 7  # evaluates the closure, updates nothing
    assert all(torch.equal(a, b) for a, b in zip(engine.module.parameters(), before))
    engine.step()
    assert not all(torch.equal(a, b) for a, b in zip(engine.module.parameters(), before))
    assert view.state_dict() == {}


def test_set_gradient_accumulation_boundary_moves_the_window() -> None:
    engine = ZeroEngine(_model(), _cfg(1, gradient_accumulation_steps=4))
    assert not engine.is_gradient_accumulation_boundary()
    engine.set_gradient_accumulation_boundary(True)  # a loop ending the window early
    assert engine.is_gradient_accumulation_boundary()
    engine.backward(engine(torch.randn(4, 6)).pow(2).mean())
    engine.step()
    assert engine.global_steps == 1  # stepped after one micro-batch, not four
    assert not engine.is_gradient_accumulation_boundary()
    for _ in range(3):
        engine.set_gradient_accumulation_boundary(False)
        assert not engine.is_gradient_accumulation_boundary()
        engine.backward(engine(torch.randn(4, 6)).pow(2).mean())
        engine.step()
    assert engine.global_steps == 1


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_allgather_bucket_size_must_be_even_at_stages_1_and_2(stage: int) -> None:
    from ds.zero.stages.partitioned import BucketSizeError

    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_optimization": {"stage": stage, "allgather_bucket_size": 1001},
    }
    if stage == 0:
        ZeroEngine(torch.nn.Linear(2, 2), cfg)
        return
    with pytest.raises(BucketSizeError, match="multiple of nccl_start_alignment_factor"):
        ZeroEngine(torch.nn.Linear(2, 2), cfg)
    assert issubclass(BucketSizeError, AssertionError)  # DeepSpeed asserts here
    cfg["zero_optimization"]["allgather_bucket_size"] = 1000
    ZeroEngine(torch.nn.Linear(2, 2), cfg)
