"""Hyperparameters are checked before any tensor is touched, in the functional kernels and at
every optimizer step: NaN or infinite values (which a comparison like ``lr < 0`` lets through)
would otherwise turn every parameter into NaN without an error."""

from __future__ import annotations

import math

import pytest
import torch

from ds.interfaces.errors import ConfigError
from ds.ops import cpu_optim
from ds.ops.optim import CPUAdagrad, CPUAdam, CPULion

NAN, INF = math.nan, math.inf


def _buffers(k: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(k)
    return [torch.rand(37, generator=gen) for _ in range(k)]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda b: cpu_optim.adam_step(*b, step=1, lr=NAN), r"lr = nan must be >= 0 and finite"),
        (lambda b: cpu_optim.adam_step(*b, step=1, lr=1e-3, eps=INF), r"eps = inf"),
        (lambda b: cpu_optim.adam_step(*b, step=1, lr=-1e-3), r"lr = -0\.001 must be >= 0"),
        (lambda b: cpu_optim.adam_step(*b, step=1, lr=1e-3, beta1=1.0), r"beta1 = 1\.0 is outside"),
        (lambda b: cpu_optim.adam_step(*b, step=1, lr=1e-3, beta2=NAN), r"beta2 = nan is outside"),
        (
            lambda b: cpu_optim.adam_step(*b, step=1, lr=1e-3, weight_decay=-INF),
            r"weight_decay = -inf",
        ),
    ],
)
def test_adam_rejects_bad_hyperparameters_untouched(call, match: str) -> None:  # type: ignore[no-untyped-def]
    bufs = _buffers(4)
    before = [t.clone() for t in bufs]
    with pytest.raises(ConfigError, match=match):
        call(bufs)
    assert all(torch.equal(a, b) for a, b in zip(bufs, before))


def test_adagrad_and_lion_reject_bad_hyperparameters() -> None:
    p, g, s = _buffers(3)
    with pytest.raises(ConfigError, match=r"weight_decay = nan"):
        cpu_optim.adagrad_step(p, g, s, lr=1e-2, weight_decay=NAN)
    with pytest.raises(ConfigError, match=r"eps = -1e-10"):
        cpu_optim.adagrad_step(p, g, s, lr=1e-2, eps=-1e-10)
    with pytest.raises(ConfigError, match=r"beta2 = 1\.5 is outside"):
        cpu_optim.lion_step(p, g, s, lr=1e-4, beta2=1.5)
    with pytest.raises(ConfigError, match=r"lr = inf"):
        cpu_optim.lion_step(p, g, s, lr=INF)
    # The edges that are valid still run: lr 0 (a warm-up's first step) and beta 0.
    cpu_optim.adam_step(*_buffers(4), step=1, lr=0.0, beta1=0.0, weight_decay=0.0)
    cpu_optim.lion_step(p, g, s, lr=0.0, beta1=0.0, beta2=0.0)


@pytest.mark.parametrize(
    ("make", "key", "value", "match"),
    [
        (lambda ps: CPUAdam(ps, lr=1e-3), "lr", NAN, r"param_groups\[0\]\['lr'\] = nan"),
        (lambda ps: CPUAdam(ps), "betas", (0.9, 1.0), r"param_groups\[0\]\['betas'\]\[1\] = 1\.0"),
        (lambda ps: CPULion(ps), "weight_decay", INF, r"param_groups\[0\]\['weight_decay'\] = inf"),
        (lambda ps: CPUAdagrad(ps), "eps", -1.0, r"param_groups\[0\]\['eps'\] = -1\.0"),
    ],
)
def test_optimizer_checks_the_group_at_every_step(make, key: str, value, match: str) -> None:  # type: ignore[no-untyped-def]
    # A scheduler or user code can change a group after the constructor checked it; the fast
    # path (cached addresses after the first step) checks it as well.
    p = torch.nn.Parameter(torch.rand(37))
    p.grad = torch.rand(37)
    opt = make([p])
    opt.step()
    opt.step()  # now on the cached fast path
    before = p.detach().clone()
    opt.param_groups[0][key] = value
    with pytest.raises(ConfigError, match=match):
        opt.step()
    assert torch.equal(p.detach(), before)


def test_constructors_reject_nan_and_inf() -> None:
    ps = [torch.nn.Parameter(torch.zeros(3))]
    with pytest.raises(ConfigError, match=r"lr = nan must be >= 0 and finite"):
        CPUAdam(ps, lr=NAN)
    with pytest.raises(ConfigError, match=r"eps = inf"):
        CPUAdagrad(ps, eps=INF)
    with pytest.raises(ConfigError, match=r"betas\[0\] = nan is outside"):
        CPULion(ps, betas=(NAN, 0.99))
    with pytest.raises(
        ConfigError, match=r"betas must be two numbers, e.g. \(0.9, 0.999\), got 0.9"
    ):
        CPUAdam(ps, betas=0.9)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"betas must be two numbers"):
        CPUAdam(ps, betas=(0.9, 0.99, 0.999))  # type: ignore[arg-type]
