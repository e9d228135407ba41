"""ds's flat optimizers reproduce torch.optim bit for bit (chunked or not), and Lion's update.

Adam: the default steps through torch's fused CPU kernel and equals ``torch.optim.AdamW(fused=True)``
bit for bit; ``fused=False`` (the config's ``torch_adam: true``) equals the single-tensor path."""

from __future__ import annotations

import pytest
import torch

from ds.zero.optim.flat import SGD, Adagrad, Adam
from ds.zero.optim.lion import Lion

CASES = [
    (
        "adamw",
        lambda p: Adam([p], lr=1e-3, weight_decay=0.1, fused=False),
        lambda p: torch.optim.AdamW([p], lr=1e-3, weight_decay=0.1, foreach=False),
    ),
    (
        "adam-l2",
        lambda p: Adam([p], lr=1e-3, weight_decay=0.1, adamw_mode=False, fused=False),
        lambda p: torch.optim.Adam([p], lr=1e-3, weight_decay=0.1, foreach=False),
    ),
    (
        "adamw-fused",
        lambda p: Adam([p], lr=1e-3, weight_decay=0.1),
        lambda p: torch.optim.AdamW([p], lr=1e-3, weight_decay=0.1, fused=True),
    ),
    (
        "adam-l2-fused",
        lambda p: Adam([p], lr=1e-3, weight_decay=0.1, adamw_mode=False),
        lambda p: torch.optim.Adam([p], lr=1e-3, weight_decay=0.1, fused=True),
    ),
    (
        "adagrad",
        lambda p: Adagrad([p], lr=1e-2, weight_decay=0.01, lr_decay=0.01),
        lambda p: torch.optim.Adagrad(
            [p], lr=1e-2, weight_decay=0.01, lr_decay=0.01, foreach=False
        ),
    ),
    (
        "sgd-nesterov",
        lambda p: SGD([p], lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.01),
        lambda p: torch.optim.SGD(
            [p], lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=False
        ),
    ),
]


@pytest.mark.parametrize("numel", [1000, 2_500_001])  # one pass, and several chunks
@pytest.mark.parametrize(("name", "ours", "theirs"), CASES, ids=[c[0] for c in CASES])
def test_bitwise_equal_to_torch(name: str, ours, theirs, numel: int) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(0)
    start = torch.randn(numel, generator=g)
    a, b = start.clone(), torch.nn.Parameter(start.clone())
    opt_a, opt_b = ours(a), theirs(b)
    for _ in range(3):
        grad = torch.randn(numel, generator=g)
        a.grad, b.grad = grad.clone(), grad.clone()
        opt_a.step()
        opt_b.step()
        assert torch.equal(a.grad, grad)  # the step reads the gradient, never scales it
    assert torch.equal(a, b.detach())


@pytest.mark.parametrize("adamw", [True, False], ids=["adamw", "adam-l2"])
def test_fused_adam_is_within_an_ulp_of_the_single_tensor_path(adamw: bool) -> None:
    g = torch.Generator().manual_seed(1)
    start = torch.randn(100_003, generator=g)
    a, b = start.clone(), start.clone()
    kw = {"lr": 1e-3, "weight_decay": 0.01, "adamw_mode": adamw}
    opt_a, opt_b = Adam([a], **kw), Adam([b], fused=False, **kw)
    for _ in range(10):
        grad = torch.randn(100_003, generator=g)
        a.grad, b.grad = grad.clone(), grad.clone()
        opt_a.step()
        opt_b.step()
    assert not torch.equal(a, b)  # two kernels, really
    ulp = torch.finfo(torch.float32).eps * b.abs().clamp_min(1e-3)
    assert ((a - b).abs() <= 2 * ulp).all()


def test_lion_update_is_signed_interpolation() -> None:
    p = torch.tensor([1.0, -1.0, 0.5])
    opt = Lion([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.0)
    p.grad = torch.tensor([0.2, -0.3, 0.0])
    opt.step()
    assert torch.allclose(p, torch.tensor([0.9, -0.9, 0.5]))
    assert torch.allclose(opt.state[p]["exp_avg"], 0.01 * torch.tensor([0.2, -0.3, 0.0]))


def test_fused_adam_takes_a_tensor_learning_rate() -> None:
    g = torch.Generator().manual_seed(2)
    start, grad = torch.randn(1001, generator=g), torch.randn(1001, generator=g)
    a, b = start.clone(), start.clone()
    opt_a, opt_b = Adam([a], lr=1e-3), Adam([b], lr=1e-3)
    opt_a.param_groups[0]["lr"] = torch.tensor(1e-3, dtype=torch.float64)  # as a scheduler may
    a.grad, b.grad = grad.clone(), grad.clone()
    opt_a.step()
    opt_b.step()
    assert torch.equal(a, b)
