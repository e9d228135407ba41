"""The PyTorch paged attention equals dense causal attention computed per sequence in float64."""

from __future__ import annotations

import pytest
import torch

from ds.inference.attention import paged_attention, write_kv
from ds.inference.ragged import build_ragged_batch


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [n, h, d] for the last n of the ctx positions in k/v: [ctx, kvh, d]."""
    n, h, _ = q.shape
    ctx, kvh, _ = k.shape
    k = k.double().repeat_interleave(h // kvh, dim=1)
    v = v.double().repeat_interleave(h // kvh, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    pos = torch.arange(ctx - n, ctx)[:, None]
    s = s.masked_fill(torch.arange(ctx)[None, :] > pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v)


@pytest.mark.parametrize("num_decodes", [3, 40])
def test_mixed_ragged_batch_matches_dense(num_decodes: int) -> None:
    g = torch.Generator().manual_seed(num_decodes)
    bs, h, kvh, d = 8, 4, 2, 16
    seen = torch.randint(1, 70, (num_decodes,), generator=g).tolist() + [0, 13]
    new = [1] * num_decodes + [20, 9]
    nblocks = [-(-(s + n) // bs) for s, n in zip(seen, new)]
    perm = torch.randperm(sum(nblocks), generator=g).tolist()
    blocks, a = [], 0
    for nb in nblocks:
        blocks.append(perm[a : a + nb])
        a += nb
    # Layout [kv_heads, blocks, block_size, dim].
    k_cache = torch.randn(kvh, len(perm), bs, d, generator=g)
    v_cache = torch.randn(kvh, len(perm), bs, d, generator=g)
    batch = build_ragged_batch([[0] * n for n in new], seen, blocks, bs)
    t = batch.num_tokens
    q = torch.randn(t, h, d, generator=g)
    write_kv(
        k_cache,
        v_cache,
        torch.randn(t, kvh, d, generator=g),
        torch.randn(t, kvh, d, generator=g),
        batch.slot_mapping,
    )
    out = paged_attention(q, k_cache, v_cache, batch, d**-0.5)
    starts = batch.query_start.tolist()
    for i, (s, n, blk) in enumerate(zip(seen, new, blocks)):
        ctx = s + n
        k = k_cache[:, blk].reshape(kvh, -1, d)[:, :ctx].transpose(0, 1)
        v = v_cache[:, blk].reshape(kvh, -1, d)[:, :ctx].transpose(0, 1)
        want = _dense(q[starts[i] : starts[i] + n], k, v, d**-0.5)
        torch.testing.assert_close(
            out[starts[i] : starts[i] + n].double(), want, atol=1e-5, rtol=1e-5
        )


def test_decode_groups_bound_padding() -> None:
    from ds.inference.attention import decode_groups

    assert decode_groups([40, 41, 39, 42]) == [[2, 0, 1, 3]]  # near-equal: one group
    lens = [5, 100, 6, 90, 7, 95]
    groups = decode_groups(lens)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert groups == [[0, 2, 4], [3, 5, 1]]
    for g in groups:  # each within the slack
        assert len(g) * max(lens[i] for i in g) <= 1.25 * sum(lens[i] for i in g)
