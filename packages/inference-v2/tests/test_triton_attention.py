"""The Triton paged-attention kernel equals the PyTorch reference (interpreter on CPU)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

if not torch.cuda.is_available():
    # Must be set before the kernel is defined (it is built on first use).
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from ds.inference.attention import paged_attention, write_kv
from ds.inference.ragged import build_ragged_batch
from ds.inference.triton_attention import paged_attention_triton


def _mixed_batch(block_size: int, heads: int, kv_heads: int, dim: int) -> tuple[Any, ...]:
    """(q, k_cache, v_cache, batch, scale): a decode, a fresh prompt, and a chunk continuing a
    cached prefix, in scattered blocks of random caches, the batch's k and v written."""
    g = torch.Generator().manual_seed(0)
    num_blocks = 24
    k_cache = torch.randn(kv_heads, num_blocks, block_size, dim, generator=g)
    v_cache = torch.randn(kv_heads, num_blocks, block_size, dim, generator=g)
    seen = [21, 0, 2 * block_size + 3]
    new = [1, 9, 5]
    perm = torch.randperm(num_blocks, generator=g).tolist()
    blocks, used = [], 0
    for s, n in zip(seen, new):
        nb = -(-(s + n) // block_size)
        blocks.append(perm[used : used + nb])
        used += nb
    batch = build_ragged_batch([list(range(n)) for n in new], seen, blocks, block_size)
    q = torch.randn(batch.num_tokens, heads, dim, generator=g)
    k = torch.randn(batch.num_tokens, kv_heads, dim, generator=g)
    v = torch.randn(batch.num_tokens, kv_heads, dim, generator=g)
    write_kv(k_cache, v_cache, k, v, batch.slot_mapping)
    scale = dim**-0.5
    return q, k_cache, v_cache, batch, scale


@pytest.mark.parametrize(
    ("block_size", "heads", "kv_heads", "dim"), [(16, 4, 2, 16), (8, 3, 1, 24)]
)
def test_kernel_matches_reference_on_mixed_batch(
    block_size: int, heads: int, kv_heads: int, dim: int
) -> None:
    q, k_cache, v_cache, batch, scale = _mixed_batch(block_size, heads, kv_heads, dim)
    want = paged_attention(q, k_cache, v_cache, batch, scale)
    got = paged_attention_triton(q, k_cache, v_cache, batch, scale)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_engine_with_triton_attention_generates_like_torch(tiny_dirs: dict[str, Path]) -> None:
    from ds.inference import SamplingParams, build_engine, generate

    ps = [list(range(5, 30)), list(range(40, 47))]
    params = SamplingParams(max_new_tokens=3)
    ref = generate(build_engine(tiny_dirs["llama"]), ps, params)
    tri = generate(build_engine(tiny_dirs["llama"], {"attention": "triton"}), ps, params)
    assert [r.tokens for r in tri] == [r.tokens for r in ref]


@pytest.mark.slow
@pytest.mark.parametrize(("window", "cap"), [(11, None), (None, 2.0), (11, 2.0)])
def test_kernel_window_and_softcap_match_reference(window: int | None, cap: float | None) -> None:
    """A sliding window (shorter than the longest context, not a block multiple) and softcapping."""
    q, k_cache, v_cache, batch, scale = _mixed_batch(16, 4, 2, 16)
    want = paged_attention(q, k_cache, v_cache, batch, scale, window=window, softcap=cap)
    got = paged_attention_triton(q, k_cache, v_cache, batch, scale, window=window, softcap=cap)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    plain = paged_attention(q, k_cache, v_cache, batch, scale)
    assert not torch.allclose(want, plain, atol=1e-3), "the option must change the result"
