"""The native paged decode attention against float64 dense attention per sequence, at odd sizes
and on every SIMD variant; all variants give the same bits; refusals."""

from __future__ import annotations

import pytest
import torch

from ds.interfaces.errors import KernelError
from ds.ops import _C
from ds.ops.attention import paged_decode

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _case(seed: int, h: int, kvh: int, d: int, bs: int, ctxs: list[int]):
    g = torch.Generator().manual_seed(seed)
    nblk = [-(-c // bs) for c in ctxs]
    nb = sum(nblk) + 3
    perm = torch.randperm(nb, generator=g).tolist()
    tables = torch.zeros(len(ctxs), max(nblk) + 1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(nblk):
        tables[i, :n] = torch.tensor(perm[used : used + n], dtype=torch.int32)
        used += n
    kc = torch.randn(kvh, nb, bs, d, generator=g) * 2
    vc = torch.randn(kvh, nb, bs, d, generator=g)
    q = torch.randn(len(ctxs), h, d, generator=g) * 2
    return q, kc, vc, tables, torch.tensor(ctxs)


def _dense(q, kc, vc, tables, ctxs, scale) -> torch.Tensor:
    s, h, d = q.shape
    kvh, _, bs, _ = kc.shape
    out = torch.empty(s, h, d, dtype=torch.float64)
    for i in range(s):
        n = int(ctxs[i])
        idx = tables[i, : -(-n // bs)].long()
        k = kc[:, idx].reshape(kvh, -1, d)[:, :n].double().repeat_interleave(h // kvh, 0)
        v = vc[:, idx].reshape(kvh, -1, d)[:, :n].double().repeat_interleave(h // kvh, 0)
        p = torch.softmax(torch.einsum("hd,hkd->hk", q[i].double(), k) * scale, -1)
        out[i] = torch.einsum("hk,hkd->hd", p, v)
    return out


CASES = [  # heads, kv heads, head_dim, block_size, contexts
    (9, 3, 64, 32, [1, 37, 64, 65, 100]),
    (4, 4, 13, 3, [1, 2, 7, 20]),
    (6, 2, 80, 16, [17, 33]),
    (2, 1, 5, 5, [11]),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_float64(simd_level: str, case: int) -> None:
    h, kvh, d, bs, ctxs = CASES[case]
    q, kc, vc, tables, ctx = _case(case, h, kvh, d, bs, ctxs)
    scale = d**-0.5
    got = paged_decode(q, kc, vc, tables, ctx, scale)
    want = _dense(q, kc, vc, tables, ctx, scale)
    assert got.dtype == torch.float32 and got.shape == q.shape
    torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=2e-5)


def test_variants_agree_bitwise() -> None:
    q, kc, vc, tables, ctx = _case(7, 9, 3, 64, 32, [5, 90, 41])
    before = _C.simd_level()
    outs = {}
    try:
        for level in _C.simd_levels_built().split(","):
            if level and _C.set_simd_level(level):
                outs[level] = paged_decode(q, kc, vc, tables, ctx, 0.125)
    finally:
        _C.set_simd_level(before)
    first = next(iter(outs.values()))
    assert all(torch.equal(o, first) for o in outs.values()), list(outs)


def test_refusals() -> None:
    q, kc, vc, tables, ctx = _case(1, 4, 2, 8, 4, [5, 9])
    with pytest.raises(KernelError, match="fp32"):
        paged_decode(q.double(), kc, vc, tables, ctx, 1.0)
    with pytest.raises(KernelError, match="multiple of kv heads"):
        paged_decode(q[:, :3].contiguous(), kc, vc, tables, ctx, 1.0)
    with pytest.raises(KernelError, match="context_lens"):
        paged_decode(q, kc, vc, tables[:1], ctx, 1.0)
    bad = tables.clone()
    bad[1, 0] = kc.shape[1]
    with pytest.raises(ValueError, match="outside the cache"):
        paged_decode(q, kc, vc, bad, ctx, 1.0)
    with pytest.raises(ValueError, match="context length"):
        paged_decode(q, kc, vc, tables, torch.tensor([5, 4 * tables.shape[1] + 1]), 1.0)
