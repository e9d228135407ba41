"""CPUAdam / CPUAdagrad / CPULion as torch.optim.Optimizers: parity with torch.optim on parameter
lists and groups, low-precision params, state_dict round trips, argument errors."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
import torch

from ds.interfaces.errors import ConfigError, KernelError
from ds.ops.optim import CPUAdagrad, CPUAdam, CPULion

SIZES = [1, 7, 1023, 4096 + 3, 33, 250]
STEPS = 100


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _params(seed: int, dtype: torch.dtype = torch.float32) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(n, generator=g).to(dtype)) for n in SIZES]


def _clone(ps: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(p.detach().clone()) for p in ps]


def _train(
    opts: list[torch.optim.Optimizer], groups: list[list[torch.nn.Parameter]], steps: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        grads = [torch.randn(p.shape, generator=gen).to(p.dtype) for p in groups[0]]
        for params in groups:
            for p, g in zip(params, grads, strict=True):
                p.grad = g.clone()
        for o in opts:
            o.step()


def _assert_close(a: list[torch.nn.Parameter], b: list[torch.nn.Parameter]) -> None:
    for x, y in zip(a, b, strict=True):
        scale = float(y.detach().abs().max()) or 1.0
        torch.testing.assert_close(x.detach(), y.detach(), rtol=1e-6, atol=1e-6 * scale)


@pytest.mark.parametrize("adamw_mode", [True, False])
def test_cpu_adam_matches_torch_on_param_groups(adamw_mode: bool) -> None:
    ps = _params(0)
    ref = _clone(ps)

    def groups(params: list[torch.nn.Parameter]) -> list[dict[str, Any]]:
        return [{"params": params[:3]}, {"params": params[3:], "lr": 3e-3, "weight_decay": 0.0}]

    kw = {"lr": 1e-3, "betas": (0.8, 0.99), "eps": 1e-7, "weight_decay": 0.05}
    ours = CPUAdam(groups(ps), adamw_mode=adamw_mode, **kw)
    assert ours.adam_w_mode is adamw_mode  # DeepSpeedCPUAdam's attribute name
    cls = torch.optim.AdamW if adamw_mode else torch.optim.Adam
    theirs = cls(groups(ref), **kw)
    _train([ours, theirs], [ps, ref], STEPS, seed=1)
    _assert_close(ps, ref)


def test_cpu_adagrad_matches_torch() -> None:
    ps = _params(2)
    ref = _clone(ps)
    kw = {"lr": 5e-2, "eps": 1e-10, "weight_decay": 0.01, "lr_decay": 1e-3}
    ours = CPUAdagrad(ps, initial_accumulator_value=0.1, **kw)
    theirs = torch.optim.Adagrad(ref, initial_accumulator_value=0.1, **kw)
    _train([ours, theirs], [ps, ref], STEPS, seed=3)
    _assert_close(ps, ref)


def test_cpu_lion_matches_float64_reference() -> None:
    ps = _params(4)
    # fp32 storage like the optimizer's (rounded once per step), arithmetic in float64
    ref = [p.detach().clone() for p in ps]
    moments = [torch.zeros_like(r) for r in ref]
    lr, (b1, b2), wd = 1e-4, (0.9, 0.99), 0.1
    opt = CPULion(ps, lr=lr, betas=(b1, b2), weight_decay=wd)
    gen = torch.Generator().manual_seed(5)
    for _ in range(STEPS):
        for p, r, m in zip(ps, ref, moments, strict=True):
            g = torch.randn(p.shape, generator=gen)
            p.grad = g
            r64, m64, g64 = r.double(), m.double(), g.double()
            c = b1 * m64 + (1 - b1) * g64
            r.copy_(r64 * (1 - lr * wd) - lr * torch.sign(c))
            m.copy_(b2 * m64 + (1 - b2) * g64)
        opt.step()
    for p, r in zip(ps, ref, strict=True):
        scale = float(r.abs().max())
        torch.testing.assert_close(p.detach(), r, rtol=1e-6, atol=1e-6 * scale)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fp32_states", [True, False])
@pytest.mark.parametrize("cls", [CPUAdam, CPUAdagrad, CPULion])
def test_low_precision_params_keep_dtypes(
    cls: Callable[..., torch.optim.Optimizer], dtype: torch.dtype, fp32_states: bool
) -> None:
    ps = _params(6, dtype)
    before = [p.detach().clone() for p in ps]
    opt = cls(ps, lr=1e-1, fp32_optimizer_states=fp32_states)
    _train([opt], [ps], 3, seed=7)
    want = torch.float32 if fp32_states else dtype
    for p, b in zip(ps, before, strict=True):
        assert p.dtype == dtype
        assert not torch.equal(p.detach(), b)
        for v in opt.state[p].values():
            if isinstance(v, torch.Tensor):
                assert v.dtype == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cls", [CPUAdam, CPUAdagrad, CPULion])
def test_state_dict_round_trip_resumes_bitwise(
    cls: Callable[..., torch.optim.Optimizer], dtype: torch.dtype
) -> None:
    # Uninterrupted run.
    ps = _params(8, dtype)
    opt = cls(ps, lr=1e-2)
    _train([opt], [ps], 4, seed=9)
    _train([opt], [ps], 4, seed=10)
    # Interrupted: save after 4 steps, load into a fresh optimizer, continue.
    qs = _params(8, dtype)
    first = cls(qs, lr=1e-2)
    _train([first], [qs], 4, seed=9)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    resumed = cls(qs, lr=1e-2)
    resumed.load_state_dict(torch.load(buf))
    for p in qs:
        for k, v in first.state[p].items():
            got = resumed.state[p][k]
            if isinstance(v, torch.Tensor):
                assert got.dtype == v.dtype  # fp32 moments of bf16 params stay fp32
                assert torch.equal(got, v)
            else:
                assert got == v
    _train([resumed], [qs], 4, seed=10)
    for p, q in zip(ps, qs, strict=True):
        assert torch.equal(p.detach(), q.detach())


def test_params_without_grad_are_skipped_and_closure_runs() -> None:
    a, b = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.ones(4))
    opt = CPUAdam([a, b], lr=0.1)

    def closure() -> float:
        opt.zero_grad()
        loss = (a * 2).sum()
        loss.backward()
        return float(loss.detach())

    assert opt.step(closure) == 8.0
    assert b.grad is None and torch.equal(b.detach(), torch.ones(4))
    torch.testing.assert_close(a.detach(), torch.full((4,), 0.9))
    assert opt.state[a]["step"] == 1 and b not in opt.state


def test_argument_errors() -> None:
    p = [torch.nn.Parameter(torch.zeros(3))]
    with pytest.raises(ConfigError, match=r"amsgrad=True is not supported.*amsgrad=False"):
        CPUAdam(p, amsgrad=True)
    with pytest.raises(ConfigError, match=r"betas\[1\] = 1.5"):
        CPUAdam(p, betas=(0.9, 1.5))
    with pytest.raises(ConfigError, match=r"lr = -1\.0 must be >= 0"):
        CPULion(p, lr=-1.0)
    with pytest.raises(KernelError, match="updates CPU parameters; got one on meta"):
        CPUAdagrad([torch.nn.Parameter(torch.zeros(3, device="meta"))])
    sparse = torch.nn.Parameter(torch.zeros(3))
    sparse.grad = torch.zeros(3).to_sparse()
    with pytest.raises(KernelError, match="sparse gradients"):
        CPUAdam([sparse]).step()
    bad = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
    bad.grad_dtype = None  # let a mixed-precision training loop hand over fp16 grads
    try:
        bad.grad = torch.zeros(3, dtype=torch.float16)
    except RuntimeError:  # torch releases without grad_dtype refuse the mismatch themselves
        assert not hasattr(torch.Tensor, "grad_dtype")
        return
    with pytest.raises(KernelError, match="unsupported dtypes: params bfloat16, grads float16"):
        CPUAdam([bad]).step()


def test_fast_path_follows_changing_grads_and_params() -> None:
    # Steady-state steps reuse a per-group plan; missing grads, swapped param storage and a new
    # param group must all be noticed and give torch's results.
    ps = _params(11)
    ref = _clone(ps)
    ours = CPUAdam(ps, lr=1e-2, weight_decay=0.1)
    theirs = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1)
    gen = torch.Generator().manual_seed(12)
    for step in range(12):
        for i, (p, r) in enumerate(zip(ps, ref, strict=True)):
            if step in (4, 5) and i == 2:
                p.grad = r.grad = None  # skipped by both; its step count falls behind
                continue
            g = torch.randn(p.shape, generator=gen)
            p.grad, r.grad = g.clone(), g.clone()
        if step == 7:
            ps[0].data = ps[0].data.clone()  # new storage: the plan's address is stale
        ours.step()
        theirs.step()
    _assert_close(ps, ref)
    assert ours.state[ps[2]]["step"] == 10 and ours.state[ps[0]]["step"] == 12
    extra = torch.nn.Parameter(torch.ones(5))
    ours.add_param_group({"params": [extra], "lr": 0.5})
    extra.grad = torch.ones(5)
    for p in ps:
        p.grad = None
    ours.step()
    torch.testing.assert_close(extra.detach(), torch.full((5,), 0.5 - 0.5 * 0.1 * 1.0))
