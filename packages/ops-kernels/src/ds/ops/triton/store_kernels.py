"""The rounding store every Triton optimizer kernel uses (imported only when triton is installed)."""

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
