"""Triton kernels of SwiGLU (``silu(a) * b``): elementwise over flat tensors, float32 math
(float64 inputs stay float64), results stored in the input dtype."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def swiglu_fwd_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a_raw = tl.load(a_ptr + offs, mask=mask, other=0.0)
    a = a_raw.to(tl.float32) if a_raw.dtype != tl.float64 else a_raw
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(a.dtype)
    s = 1.0 / (1.0 + tl.exp(-a))
    out = a * s * b
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_bwd_kernel(g_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a_raw = tl.load(a_ptr + offs, mask=mask, other=0.0)
    a = a_raw.to(tl.float32) if a_raw.dtype != tl.float64 else a_raw
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(a.dtype)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(a.dtype)
    s = 1.0 / (1.0 + tl.exp(-a))
    da = g * b * s * (1.0 + a * (1.0 - s))
    db = g * a * s
    tl.store(da_ptr + offs, da.to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offs, db.to(db_ptr.dtype.element_ty), mask=mask)
