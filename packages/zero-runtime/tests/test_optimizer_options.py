"""Every optimizer option is honoured on every path (host flat optimizers, CPU-offload kernels) or
refused on every path with one clear line; none is dropped."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _batches import regression_batches

from ds.interfaces.errors import ConfigError
from ds.ops.provider import CpuKernelProvider
from ds.zero.engine import ZeroEngine
from ds.zero.optim.flat import Adam
from ds.zero.optim.provider import ProviderAdam

LR, BETAS, EPS, WD = 1e-2, (0.9, 0.999), 1e-8, 0.1


def _adam_uncorrected_f64(p: torch.Tensor, grads: list[torch.Tensor], adamw: bool) -> torch.Tensor:
    """DeepSpeed's Adam with bias_correction=false, in float64: p -= lr * m / (sqrt(v) + eps)."""
    p = p.double().clone()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for g in grads:
        g = g.double()
        if adamw:
            p = p * (1 - LR * WD)
        else:
            g = g + WD * p
        m = BETAS[0] * m + (1 - BETAS[0]) * g
        v = BETAS[1] * v + (1 - BETAS[1]) * g * g
        p = p - LR * m / (v.sqrt() + EPS)
    return p


@pytest.mark.parametrize("adamw", [True, False], ids=["adamw", "adam-l2"])
@pytest.mark.parametrize("path", ["host", "offload"])
def test_adam_without_bias_correction_matches_float64(path: str, adamw: bool) -> None:
    g = torch.Generator().manual_seed(0)
    start = torch.randn(3000, generator=g)
    grads = [torch.randn(3000, generator=g) for _ in range(4)]
    p = start.clone()
    hyper: dict[str, Any] = {"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": WD}
    if path == "host":
        opt: torch.optim.Optimizer = Adam([p], adamw_mode=adamw, bias_correction=False, **hyper)
    else:
        opt = ProviderAdam(
            [p], CpuKernelProvider(), adamw_mode=adamw, bias_correction=False, **hyper
        )
    for grad in grads:
        p.grad = grad.clone()
        opt.step()
    want = _adam_uncorrected_f64(start, grads, adamw)
    torch.testing.assert_close(p.double(), want, rtol=1e-5, atol=1e-6)
    # Not vacuous: with bias correction the first steps are ~10x larger.
    corrected = torch.nn.Parameter(start.clone())
    torch_cls = torch.optim.AdamW if adamw else torch.optim.Adam
    ref = torch_cls([corrected], foreach=False, **hyper)
    for grad in grads:
        corrected.grad = grad.clone()
        ref.step()
    assert (corrected.detach().double() - want).abs().max() > 1e-2


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))


def _train(
    model: torch.nn.Module, optimizer: dict[str, Any], offload: str, stage: int = 2
) -> list[torch.Tensor]:
    zero: dict[str, Any] = {"stage": stage}
    if offload != "none":
        zero["offload_optimizer"] = {"device": offload}
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_clipping": 0.0,
        "optimizer": optimizer,
        "zero_optimization": zero,
    }
    engine = ZeroEngine(model, cfg, kernels=CpuKernelProvider())
    return _three_steps(engine, model)


def _three_steps(engine: ZeroEngine, model: torch.nn.Module) -> list[torch.Tensor]:
    """Three engine steps on the fixed regression batches; the model's final weights."""
    for x, y in regression_batches(3):
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
    engine.synchronize_parameters()
    return [p.detach().clone() for p in model.parameters()]


def _torch_run(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    for x, y in regression_batches(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_bias_correction_false_trains_the_same_on_host_and_offload() -> None:
    # BingBertSquad's optimizer section: trains on DeepSpeed with and without offload.
    section = {
        "type": "Adam",
        "params": {"lr": 3e-3, "weight_decay": 0.0, "bias_correction": False},
    }
    host = _train(_model(), section, "none", stage=1)
    _close(host, _train(_model(), section, "cpu", stage=1))
    corrected = _train(_model(), {"type": "Adam", "params": {"lr": 3e-3}}, "none", stage=1)
    assert max((a - b).abs().max().item() for a, b in zip(host, corrected)) > 1e-3


@pytest.mark.parametrize("offload", ["none", "cpu"])
def test_adagrad_lr_decay_and_initial_accumulator_are_honoured(offload: str) -> None:
    params = {"lr": 0.1, "lr_decay": 0.5, "initial_accumulator_value": 0.3, "weight_decay": 0.01}
    got = _train(_model(), {"type": "Adagrad", "params": params}, offload)
    ref_model = _model()
    want = _torch_run(
        ref_model, torch.optim.Adagrad(ref_model.parameters(), foreach=False, **params)
    )
    _close(got, want)
    plain_model = _model()
    plain = _torch_run(plain_model, torch.optim.Adagrad(plain_model.parameters(), lr=0.1))
    assert max((a - b).abs().max().item() for a, b in zip(want, plain)) > 1e-3


@pytest.mark.parametrize("kind", ["Adam", "AdamW", "Adagrad"])
@pytest.mark.parametrize("offload", ["none", "cpu"])
def test_amsgrad_is_refused_on_every_path(kind: str, offload: str) -> None:
    section = {"type": kind, "params": {"lr": 1e-3, "amsgrad": True}}
    with pytest.raises(ConfigError, match=r"amsgrad=true.*no AMSGrad variant.*remove it"):
        _train(_model(), section, offload)
    # amsgrad=false is what every path does: accepted.
    _train(_model(), {"type": kind, "params": {"lr": 1e-3, "amsgrad": False}}, offload)


@pytest.mark.parametrize("offload", ["none", "cpu"])
def test_implementation_keys_are_accepted(offload: str) -> None:
    params = {"lr": 1e-2, "torch_adam": True, "set_grad_none": True, "fp32_optimizer_states": True}
    got = _train(_model(), {"type": "AdamW", "params": params}, offload)
    plain = _train(_model(), {"type": "AdamW", "params": {"lr": 1e-2}}, offload)
    _close(got, plain)


def _offloaded_client(opt_cls: type, **kw: Any) -> list[torch.Tensor]:
    model = _model()
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
        # a torch optimizer under offload is run on the host kernels only when asked to
        "zero_force_ds_cpu_optimizer": False,
    }
    engine = ZeroEngine(
        model, cfg, optimizer=opt_cls(model.parameters(), **kw), kernels=CpuKernelProvider()
    )
    return _three_steps(engine, model)


@pytest.mark.parametrize("option", ["amsgrad", "maximize"])
def test_offloaded_client_adam_refuses_what_the_kernels_lack(option: str) -> None:
    with pytest.raises(ConfigError, match=rf"Adam\({option}=True\) cannot run on the offloaded"):
        _offloaded_client(torch.optim.Adam, lr=1e-2, **{option: True})


def test_offloaded_client_adam_keeps_decoupled_weight_decay() -> None:
    got = _offloaded_client(
        torch.optim.Adam, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True
    )
    ref_model = _model()
    ref = torch.optim.AdamW(ref_model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    _close(got, _torch_run(ref_model, ref))


@pytest.mark.parametrize("adamw", [True, False])
def test_offloaded_client_cpu_adam_runs_as_the_torch_adam(adamw: bool) -> None:
    """accelerate hands the engine DeepSpeedCPUAdam (ds.ops' CPUAdam) in place of a Trainer's
    AdamW when the optimizer is offloaded: it trains as the torch Adam of its mode."""
    from ds.ops.optim.adam import CPUAdam

    got = _offloaded_client(CPUAdam, lr=1e-2, weight_decay=0.1, adamw_mode=adamw)
    ref_model = _model()
    torch_cls = torch.optim.AdamW if adamw else torch.optim.Adam
    ref = torch_cls(ref_model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    _close(got, _torch_run(ref_model, ref))


def test_offloaded_client_cpu_adagrad_runs_as_the_torch_adagrad() -> None:
    from ds.ops.optim.adagrad import CPUAdagrad

    got = _offloaded_client(CPUAdagrad, lr=0.1, lr_decay=0.5, initial_accumulator_value=0.3)
    ref_model = _model()
    ref = torch.optim.Adagrad(
        ref_model.parameters(), lr=0.1, lr_decay=0.5, initial_accumulator_value=0.3, foreach=False
    )
    _close(got, _torch_run(ref_model, ref))


def test_offload_refuses_a_client_torch_optimizer_unless_allowed() -> None:
    from ds.ops.optim.adam import CPUAdam

    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}},
    }
    model = _model()
    with pytest.raises(ConfigError, match="zero_force_ds_cpu_optimizer"):
        ZeroEngine(
            model, cfg, optimizer=torch.optim.Adam(model.parameters()), kernels=CpuKernelProvider()
        )
    # ds's host-kernel optimizers pass; so does any torch optimizer without offload
    ZeroEngine(model, cfg, optimizer=CPUAdam(model.parameters()), kernels=CpuKernelProvider())
    del cfg["zero_optimization"]["offload_optimizer"]
    ZeroEngine(model, cfg, optimizer=torch.optim.Adam(model.parameters()))


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_untested_client_optimizer_needs_the_config_key(stage: int) -> None:
    from ds.zero.optim.build import UntestedOptimizerError

    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": stage},
    }
    model = _model()
    if stage == 0:  # no ZeRO, no check (as in DeepSpeed)
        ZeroEngine(model, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        return
    with pytest.raises(UntestedOptimizerError, match="zero_allow_untested_optimizer"):
        ZeroEngine(model, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(UntestedOptimizerError, match="RMSprop"):
        ZeroEngine(model, cfg, optimizer=lambda ps: torch.optim.RMSprop(ps))
    assert issubclass(UntestedOptimizerError, AssertionError)  # DeepSpeed asserts here
    ZeroEngine(model, cfg, optimizer=torch.optim.AdamW(model.parameters()))
    cfg["zero_allow_untested_optimizer"] = True
    ZeroEngine(model, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
