"""Stage 3's linear autograd function: the gradients of ``F.linear``, under torch.func
transforms, and with backward in the autocast state of forward."""

from __future__ import annotations

import torch

from ds.zero.stage3.linear import LinearFunctionForZeroStage3


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(3, 8, generator=g),
        torch.randn(4, 8, generator=g),
        torch.randn(4, generator=g),
    )


def test_gradients_match_functional_linear() -> None:
    x, w, b = (t.requires_grad_() for t in _inputs())
    rx, rw, rb = (t.detach().clone().requires_grad_() for t in (x, w, b))
    LinearFunctionForZeroStage3.apply(x[0], w, b).sum().backward()  # unbatched input
    torch.nn.functional.linear(rx[0], rw, rb).sum().backward()
    for got, want in ((x.grad, rx.grad), (w.grad, rw.grad), (b.grad, rb.grad)):
        torch.testing.assert_close(got, want)


def test_torch_func_grad_and_vmap() -> None:
    x, w, b = _inputs()
    grads = torch.func.grad(
        lambda w_, x_: LinearFunctionForZeroStage3.apply(x_, w_, b).sum(), argnums=(0, 1)
    )(w, x)
    ref = torch.func.grad(lambda w_, x_: (x_ @ w_.t() + b).sum(), argnums=(0, 1))(w, x)
    torch.testing.assert_close(grads, ref)
    per_row = torch.func.vmap(lambda xi: LinearFunctionForZeroStage3.apply(xi, w, b).sum())(x)
    torch.testing.assert_close(per_row, (x @ w.t() + b).sum(-1))


def test_backward_follows_forward_autocast() -> None:
    x, w, _ = (t.requires_grad_() for t in _inputs())
    with torch.autocast("cpu", torch.bfloat16):
        out = LinearFunctionForZeroStage3.apply(x, w, None)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()  # a bf16 grad against fp32 saved tensors
    assert w.grad is not None and w.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    w.grad = x.grad = None
    plain = LinearFunctionForZeroStage3.apply(x, w, None)
    with torch.autocast("cpu", torch.bfloat16):  # an outer autocast does not leak into backward
        plain.sum().backward()
    torch.testing.assert_close(w.grad, torch.ones(4, 3) @ x.detach())
