"""Triton kernels of SwiGLU (``silu(a) * b``): elementwise over flat tensors, float32 math
(float64 inputs stay float64), results stored in the input dtype."""

from __future__ import annotations

import triton
import triton.language as tl

from ds.ops.triton.store_kernels import block_offsets


@triton.jit
def _gate_operands(a_ptr, b_ptr, n, BLOCK: tl.constexpr):
    # The forward and the backward read the same block of ``a`` and ``b`` in the same math dtype
    # and both need ``sigmoid(a)``.
    offs, mask = block_offsets(n, BLOCK)
    a_raw = tl.load(a_ptr + offs, mask=mask, other=0.0)
    a = a_raw.to(tl.float32) if a_raw.dtype != tl.float64 else a_raw
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(a.dtype)
    s = 1.0 / (1.0 + tl.exp(-a))
    return offs, mask, a, b, s


@triton.jit
def swiglu_fwd_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs, mask, a, b, s = _gate_operands(a_ptr, b_ptr, n, BLOCK)
    out = a * s * b
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_bwd_kernel(g_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n, BLOCK: tl.constexpr):
    offs, mask, a, b, s = _gate_operands(a_ptr, b_ptr, n, BLOCK)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(a.dtype)
    da = g * b * s * (1.0 + a * (1.0 - s))
    db = g * a * s
    tl.store(da_ptr + offs, da.to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offs, db.to(db_ptr.dtype.element_ty), mask=mask)
