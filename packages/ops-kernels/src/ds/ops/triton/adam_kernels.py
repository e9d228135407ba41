"""The Triton kernel of the fused Adam/AdamW step (imported only when triton is installed)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _store(ptr, offs, x, mask):
    # fp32 -> bf16 rounds to nearest even here, by bit arithmetic: the Triton interpreter's bf16
    # downcast truncates, and the compiled one rounds; pre-rounding makes both store the same.
    if ptr.dtype.element_ty == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        rounded = bits.to(tl.float32, bitcast=True)
        x = tl.where(x != x, x, rounded)  # NaN stays NaN
    tl.store(ptr + offs, x.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def adam_kernel(
    p_ptr,
    g_ptr,
    m_ptr,
    v_ptr,
    n,
    beta1,
    beta2,
    one_minus_beta1,
    one_minus_beta2,
    eps,
    weight_decay,
    decay,
    step_size,
    inv_sqrt_bc2,
    ADAMW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if not ADAMW:
        g = g + weight_decay * p
    m = beta1 * m + one_minus_beta1 * g
    v = beta2 * v + one_minus_beta2 * g * g
    denom = tl.sqrt(v) * inv_sqrt_bc2 + eps
    if ADAMW:
        p = p * decay
    p = p - step_size * (m / denom)
    _store(p_ptr, offs, p, mask)
    _store(m_ptr, offs, m, mask)
    _store(v_ptr, offs, v, mask)
