# mypy: disable-error-code="import-untyped,untyped-decorator,no-untyped-def"
"""Paged attention as a Triton kernel (GPUs; on CPU it runs under ``TRITON_INTERPRET=1``).

Same contract as :func:`ds.inference.attention.paged_attention`: one program per (query token,
head) walks its sequence's KV blocks through the block table with an online softmax, so no
padded copy of the context is ever materialised. Sliding windows and softcapping as in the
reference: a window skips the blocks before it, a softcap bends the scores before the mask.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ds.inference.ragged import RaggedBatch
from ds.interfaces.errors import KernelError


@functools.cache
def _kernel() -> Any:
    # Built on first use so that TRITON_INTERPRET, read when a kernel is defined, can be set by
    # the caller, and so that importing ds.inference never imports triton.
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise KernelError(
            "attention='triton' needs the triton package (pip install triton); "
            "use attention='torch' otherwise"
        ) from exc

    @triton.jit
    def paged_attention_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        out_ptr,
        tables_ptr,
        token_seq_ptr,
        positions_ptr,
        scale,
        cap,
        stride_qt,
        stride_qh,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_ot,
        stride_oh,
        stride_tb,
        GROUP: tl.constexpr,
        BLOCK: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        D_PAD: tl.constexpr,
        WINDOW: tl.constexpr,
        SOFTCAP: tl.constexpr,
    ):
        t = tl.program_id(0)
        h = tl.program_id(1)
        kvh = h // GROUP
        seq = tl.load(token_seq_ptr + t)
        pos = tl.load(positions_ptr + t)
        offs_d = tl.arange(0, D_PAD)
        dmask = offs_d < HEAD_DIM
        offs_s = tl.arange(0, BLOCK)
        q = tl.load(q_ptr + t * stride_qt + h * stride_qh + offs_d, mask=dmask, other=0.0)
        q = q.to(tl.float32)
        m = tl.full((1,), float("-inf"), tl.float32)
        denom = tl.zeros((1,), tl.float32)
        acc = tl.zeros((D_PAD,), tl.float32)
        lo = 0
        if WINDOW > 0:
            lo = tl.maximum(pos - WINDOW + 1, 0) // BLOCK
        for j in range(lo, pos // BLOCK + 1):
            blk = tl.load(tables_ptr + seq * stride_tb + j).to(tl.int64)
            kv_off = (
                blk * stride_kb + offs_s[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :]
            )
            k = tl.load(k_ptr + kv_off, mask=dmask[None, :], other=0.0).to(tl.float32)
            s = tl.sum(k * q[None, :], axis=1) * scale
            if SOFTCAP:
                # tanh through the sigmoid, which every Triton backend has.
                s = cap * (2.0 * tl.sigmoid(2.0 * s / cap) - 1.0)
            kpos = j * BLOCK + offs_s
            visible = kpos <= pos
            if WINDOW > 0:
                visible = visible & (kpos > pos - WINDOW)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=0))
            p = tl.exp(s - m_new)
            alpha = tl.exp(m - m_new)
            v = tl.load(v_ptr + kv_off, mask=dmask[None, :], other=0.0).to(tl.float32)
            denom = denom * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            m = m_new
        out = acc / denom
        tl.store(
            out_ptr + t * stride_ot + h * stride_oh + offs_d,
            out.to(out_ptr.dtype.element_ty),
            mask=dmask,
        )

    return paged_attention_kernel


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: RaggedBatch,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    alibi: torch.Tensor | None = None,
) -> torch.Tensor:
    """``q``: [T, heads, head_dim] in ragged order -> attention output of the same shape."""
    if alibi is not None:
        raise KernelError("the Triton kernel has no ALiBi bias; use attention='torch'")
    t, h, d = q.shape
    kvh, _, bs, _ = k_cache.shape
    if bs & (bs - 1):
        raise KernelError(f"the Triton kernel needs a power-of-two block size (got {bs})")
    if k_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise KernelError("the Triton kernel needs the head dimension contiguous")
    out = torch.empty_like(q)
    tables = batch.block_tables.contiguous()
    _kernel()[(t, h)](
        q,
        k_cache,
        v_cache,
        out,
        tables,
        batch.token_seq,
        batch.positions,
        scale,
        float(softcap or 1.0),
        q.stride(0),
        q.stride(1),
        k_cache.stride(1),  # per block
        k_cache.stride(2),  # per slot in a block
        k_cache.stride(0),  # per kv head
        out.stride(0),
        out.stride(1),
        tables.stride(0),
        GROUP=h // kvh,
        BLOCK=bs,
        HEAD_DIM=d,
        D_PAD=max(16, 1 << (d - 1).bit_length()),
        WINDOW=int(window or 0),
        SOFTCAP=softcap is not None,
    )
    return out
