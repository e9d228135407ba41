"""The loads and the rounding store every Triton optimizer kernel uses (imported only when triton
is installed)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def store_rounded(ptr, offs, x, mask):
    # fp32 -> bf16 rounds to nearest even here, by bit arithmetic: the Triton interpreter's bf16
    # downcast truncates, and the compiled one rounds; pre-rounding makes both store the same.
    if ptr.dtype.element_ty == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        rounded = bits.to(tl.float32, bitcast=True)
        x = tl.where(x != x, x, rounded)  # NaN stays NaN
    tl.store(ptr + offs, x.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def block_offsets(n, BLOCK: tl.constexpr):
    # 64-bit offsets: a flat buffer of a large model holds more than 2**31 elements.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return offs, offs < n


@triton.jit
def load_step(p_ptr, g_ptr, s_ptr, n, BLOCK: tl.constexpr):
    # Every optimizer step reads its block of the parameter, the gradient and a state buffer,
    # in float32.
    offs, mask = block_offsets(n, BLOCK)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return offs, mask, p, g, s


@triton.jit
def store_step(p_ptr, s_ptr, lp_ptr, offs, p, s, mask, HAS_LP: tl.constexpr):
    # ... and writes back the parameter, that state and, when there is one, the parameter's
    # low-precision copy.
    store_rounded(p_ptr, offs, p, mask)
    store_rounded(s_ptr, offs, s, mask)
    if HAS_LP:
        store_rounded(lp_ptr, offs, p, mask)
