"""The dense output head against a float64 product, and the scheduler's batched greedy pick
against argmax (ties, NaN, -inf rows)."""

from __future__ import annotations

import pytest
import torch

from ds.inference.models.blocks import DenseHead
from ds.inference.scheduler import _greedy_tokens


@pytest.mark.parametrize("rows", [1, 2, 7, 16, 32, 33, 64])  # both sides of the transposed path
@pytest.mark.parametrize("bias", [False, True])
def test_dense_head_matches_float64(rows: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(1003, 67, generator=g)
    b = torch.randn(1003, generator=g) if bias else None
    x = torch.randn(rows, 67, generator=g)
    y = DenseHead(w, b)(x)
    ref = x.double() @ w.double().t() + (0 if b is None else b.double())
    assert y.shape == (rows, 1003) and y.is_contiguous() and y.dtype == torch.float32
    # fp32 accumulation over 67 terms: relative to sum |x||w|.
    bound = (x.double().abs() @ w.double().abs().t()) * 1e-6 + 1e-6
    assert ((y.double() - ref).abs() <= bound).all()


class _Sampler:
    plain_greedy = True


class _Req:
    def __init__(self, uid: int) -> None:
        self.uid, self.fed, self.tokens, self.sampler = uid, 0, [1], _Sampler()


def test_greedy_tokens_equal_argmax() -> None:
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 4, (515,), generator=g).float() for _ in range(6)]
    rows[1][[7, 300]] = float("nan")  # NaN wins, the first one
    rows[2][:] = float("-inf")
    rows[3][:] = 2.0  # all tied: index 0
    plan = [(_Req(u), 1) for u in range(6)]
    got = _greedy_tokens(plan, list(rows))
    assert got == {u: int(torch.argmax(r)) for u, r in enumerate(rows)}
    assert got[1] == 7 and got[3] == 0
