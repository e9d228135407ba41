"""The engine's optimizer is a real ``torch.optim.Optimizer`` at every stage, with and without CPU
offload: torch's ``LambdaLR`` (what transformers builds when a config has an ``optimizer`` and no
``scheduler``) drives its learning rate, step hooks fire, and ``state_dict`` round-trips."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from _batches import regression_batches
from torch.optim.lr_scheduler import LambdaLR

from ds.ops.provider import CpuKernelProvider
from ds.zero.engine import ZeroEngine

PATHS = [
    (0, "none"),
    (1, "none"),
    (2, "none"),
    (3, "none"),
    (1, "cpu"),
    (2, "cpu"),
    (3, "cpu"),
    (3, "nvme"),
]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))


def _decay(step: int) -> float:
    return 0.5**step


def _engine(
    model: torch.nn.Module, stage: int, offload: str, swap: str = "", **kw: Any
) -> ZeroEngine:
    zero: dict[str, Any] = {"stage": stage}
    if offload != "none":
        zero["offload_optimizer"] = {"device": offload, "nvme_path": swap or None}
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
        "zero_optimization": zero,
    }
    return ZeroEngine(model, cfg, kernels=CpuKernelProvider(), **kw)


@pytest.mark.parametrize(("stage", "offload"), PATHS)
def test_lambda_lr_and_step_hooks_on_the_engine_optimizer(
    stage: int, offload: str, tmp_path: Path
) -> None:
    model = _model()
    ref = copy.deepcopy(model)
    # As DeepSpeed (and accelerate, for transformers) pass it: a callable given the optimizer.
    sched = lambda opt: LambdaLR(opt, _decay)  # noqa: E731
    engine = _engine(model, stage, offload, str(tmp_path), lr_scheduler=sched)
    opt = engine.optimizer
    assert isinstance(opt, torch.optim.Optimizer)
    assert isinstance(engine.lr_scheduler, LambdaLR)
    calls: list[str] = []
    opt.register_step_pre_hook(lambda o, a, k: calls.append("pre"))
    opt.register_step_post_hook(lambda o, a, k: calls.append("post"))

    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01, foreach=False)
    ref_sched = LambdaLR(ref_opt, _decay)
    for x, y in regression_batches(3):
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
        ref_sched.step()
    assert calls == ["pre", "post"] * 3
    assert engine.get_lr() == pytest.approx([1e-2 * 0.5**3])
    # The schedule drove the updates: the parameters follow the scheduled torch run.
    full = _weights(engine)
    for name, want in ref.state_dict().items():
        torch.testing.assert_close(full[name], want, rtol=1e-5, atol=1e-6)

    fired: list[str] = []
    opt.register_state_dict_pre_hook(lambda o: fired.append("save"))
    opt.register_load_state_dict_post_hook(lambda o: fired.append("load"))
    saved = opt.state_dict()
    assert saved["param_groups"][0]["lr"] == pytest.approx(1e-2 * 0.5**3)
    assert saved["param_groups"][0]["initial_lr"] == 1e-2
    assert all(s["step"] == 3 for s in saved["state"].values())
    opt.load_state_dict(saved)
    assert fired == ["save", "load"]


def _weights(engine: ZeroEngine) -> dict[str, torch.Tensor]:
    if engine.zero_optimization_stage() == 3:
        return engine.strategy.consolidated_state_dict()  # type: ignore[attr-defined,no-any-return]
    engine.synchronize_parameters()
    return engine.module.state_dict()


def test_torch_schedulers_chain_on_a_config_optimizer() -> None:
    # Any torch scheduler, not only LambdaLR: built by the user on engine.optimizer afterwards.
    engine = _engine(_model(), 1, "none")
    sched = torch.optim.lr_scheduler.StepLR(engine.optimizer, step_size=1, gamma=0.1)
    for _ in range(2):
        engine.backward(engine(torch.randn(4, 6)).square().mean())
        engine.step()
        sched.step()
    assert engine.get_lr() == pytest.approx([1e-4])


def test_a_copy_keeps_the_kernels_and_steps_the_same() -> None:
    from ds.zero.optim.provider import ProviderAdam

    p = torch.linspace(-1, 1, 64)
    p.grad = torch.linspace(0.5, -0.5, 64)
    opt = ProviderAdam([p], CpuKernelProvider(), lr=1e-2)
    opt.step()
    twin = copy.deepcopy(opt)
    q = twin.param_groups[0]["params"][0]
    assert twin.kernels is not None and q is not p and torch.equal(q, p)
    opt.step()
    twin.step()
    assert torch.equal(q, p) and twin.state[q]["step"] == 2
