"""Triton kernels of group-wise quantization: a program handles ROWS groups (a [ROWS, BLOCK]
tile, so small groups still give each program enough work), float32 arithmetic mirroring
ds.ops.quant.reference operation for operation (division with div_rn, rounding by the 1.5 * 2^23
trick, fp8 codes built from the float32 bits), so GPU results equal the CPU ones. Launches pass
``enable_fp_fusion=False`` on GPUs: a fused multiply-add would round differently.
"""

from __future__ import annotations

import triton
import triton.language as tl

_RNE_MAGIC = 12582912.0  # 1.5 * 2^23
_FLT_MIN = 1.1754943508222875e-38  # smallest normal float32
_FLT_MAX = 3.4028234663852886e38  # largest finite float32


@triton.jit
def _normal(scale, spread):
    # A nonzero spread gets at least the smallest normal scale: 1 / scale stays finite, and a group
    # of tiny subnormals (spread / qmax underflows to 0) is not all encoded as 0.
    return tl.where(spread > 0, tl.maximum(scale, _FLT_MIN), scale)


@triton.jit
def _rne(v):
    return (v + _RNE_MAGIC) - _RNE_MAGIC


@triton.jit
def _int_params(amax, hi, lo, ASYM: tl.constexpr, QMIN: tl.constexpr, QMAX: tl.constexpr):
    if ASYM:
        spread = hi - lo
        # hi - lo overflows only for finite values of opposite sign near the float32 maximum.
        over = (spread > _FLT_MAX) & (hi <= _FLT_MAX) & (lo >= -_FLT_MAX)
        split = tl.math.div_rn(hi, (QMAX - QMIN) * 1.0) - tl.math.div_rn(lo, (QMAX - QMIN) * 1.0)
        scale = _normal(tl.where(over, split, tl.math.div_rn(spread, (QMAX - QMIN) * 1.0)), spread)
    else:
        scale = _normal(tl.math.div_rn(amax, QMAX * 1.0), amax)
    inv = tl.where(scale > 0, tl.math.div_rn(1.0, tl.where(scale > 0, scale, 1.0)), 0.0)
    if ASYM:
        zp = tl.minimum(tl.maximum(_rne(-lo * inv), 0.0), QMAX * 1.0)
    else:
        zp = scale * 0.0
    return scale, inv, zp


@triton.jit
def _code(x, inv, zp, QMIN: tl.constexpr, QMAX: tl.constexpr):
    return tl.minimum(tl.maximum(_rne(x * inv) + zp, QMIN * 1.0), QMAX * 1.0)


@triton.jit
def _rows(G, ROWS: tl.constexpr):
    g = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    return g, g < G


@triton.jit
def quant_int8_kernel(
    x_ptr, data_ptr, scale_ptr, zp_ptr, n, G,
    GS: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, ASYM: tl.constexpr,
    QMIN: tl.constexpr, QMAX: tl.constexpr,
):  # fmt: skip
    g, row_ok = _rows(G, ROWS)
    offs = tl.arange(0, BLOCK)
    idx = g[:, None] * GS + offs[None, :]
    slot = row_ok[:, None] & (offs[None, :] < GS)
    real = slot & (idx < n)
    x = tl.load(x_ptr + idx, mask=real, other=0.0).to(tl.float32)
    hi = tl.maximum(tl.max(x, axis=1), 0.0)
    lo = tl.minimum(tl.min(x, axis=1), 0.0)
    amax = tl.max(tl.abs(x), axis=1)
    scale, inv, zp = _int_params(amax, hi, lo, ASYM, QMIN, QMAX)
    q = tl.where(real, _code(x, inv[:, None], zp[:, None], QMIN, QMAX), zp[:, None])
    tl.store(data_ptr + idx, (q.to(tl.int32) & 0xFF).to(tl.uint8), mask=slot)
    tl.store(scale_ptr + g, scale, mask=row_ok)
    if ASYM:
        tl.store(zp_ptr + g, zp, mask=row_ok)


@triton.jit
def quant_int4_kernel(
    x_ptr, data_ptr, scale_ptr, zp_ptr, n, G,
    GS: tl.constexpr, BPG: tl.constexpr, HALF: tl.constexpr, ROWS: tl.constexpr,
    ASYM: tl.constexpr, QMIN: tl.constexpr, QMAX: tl.constexpr, BIAS: tl.constexpr,
):  # fmt: skip
    g, row_ok = _rows(G, ROWS)
    j = tl.arange(0, HALF)[None, :]
    i0 = 2 * j
    i1 = 2 * j + 1
    base = g[:, None] * GS
    r0 = row_ok[:, None] & (i0 < GS) & (base + i0 < n)
    r1 = row_ok[:, None] & (i1 < GS) & (base + i1 < n)
    x0 = tl.load(x_ptr + base + i0, mask=r0, other=0.0).to(tl.float32)
    x1 = tl.load(x_ptr + base + i1, mask=r1, other=0.0).to(tl.float32)
    hi = tl.maximum(tl.maximum(tl.max(x0, axis=1), tl.max(x1, axis=1)), 0.0)
    lo = tl.minimum(tl.minimum(tl.min(x0, axis=1), tl.min(x1, axis=1)), 0.0)
    amax = tl.maximum(tl.max(tl.abs(x0), axis=1), tl.max(tl.abs(x1), axis=1))
    scale, inv, zp = _int_params(amax, hi, lo, ASYM, QMIN, QMAX)
    inv2 = inv[:, None]
    zp2 = zp[:, None]
    pad = zp2.to(tl.int32) + BIAS
    c0 = tl.where(r0, _code(x0, inv2, zp2, QMIN, QMAX).to(tl.int32) + BIAS, pad)
    c1 = tl.where(r1, _code(x1, inv2, zp2, QMIN, QMAX).to(tl.int32) + BIAS, pad)
    c1 = tl.where(i1 < GS, c1, 0)
    out_mask = row_ok[:, None] & (j < BPG)
    tl.store(data_ptr + g[:, None] * BPG + j, (c0 | (c1 << 4)).to(tl.uint8), mask=out_mask)
    tl.store(scale_ptr + g, scale, mask=row_ok)
    if ASYM:
        tl.store(zp_ptr + g, zp, mask=row_ok)


@triton.jit
def quant_fp8_kernel(
    x_ptr, data_ptr, scale_ptr, n, G,
    GS: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, FMAX: tl.constexpr,
    M: tl.constexpr, BIAS: tl.constexpr, MAGIC_F: tl.constexpr, MAGIC_BITS: tl.constexpr,
    MIN_NORMAL_BITS: tl.constexpr,
):  # fmt: skip
    g, row_ok = _rows(G, ROWS)
    offs = tl.arange(0, BLOCK)
    idx = g[:, None] * GS + offs[None, :]
    slot = row_ok[:, None] & (offs[None, :] < GS)
    real = slot & (idx < n)
    x = tl.load(x_ptr + idx, mask=real, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    scale = _normal(tl.math.div_rn(amax, FMAX), amax)
    inv = tl.where(scale > 0, tl.math.div_rn(1.0, tl.where(scale > 0, scale, 1.0)), 0.0)
    y = tl.minimum(tl.maximum(x * inv[:, None], -FMAX), FMAX)
    b = y.to(tl.uint32, bitcast=True)
    sign = (b >> 24) & 0x80
    a = b & 0x7FFFFFFF
    sub = (a.to(tl.float32, bitcast=True) + MAGIC_F).to(tl.uint32, bitcast=True) - MAGIC_BITS
    shift: tl.constexpr = 23 - M
    rebias: tl.constexpr = (127 - BIAS) << 23
    normal_a = tl.maximum(a, MIN_NORMAL_BITS)  # keeps the unused branch from wrapping around
    nor = (normal_a + ((1 << (shift - 1)) - 1) + ((normal_a >> shift) & 1) - rebias) >> shift
    code = tl.where(a < MIN_NORMAL_BITS, sub, nor) | sign
    code = tl.where(real, code, 0)
    tl.store(data_ptr + idx, code.to(tl.uint8), mask=slot)
    tl.store(scale_ptr + g, scale, mask=row_ok)


@triton.jit
def dequant_int_kernel(
    data_ptr, scale_ptr, zp_ptr, out_ptr, n, G,
    GS: tl.constexpr, BPG: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
    BITS: tl.constexpr, ASYM: tl.constexpr,
):  # fmt: skip
    g, row_ok = _rows(G, ROWS)
    offs = tl.arange(0, BLOCK)[None, :]
    idx = g[:, None] * GS + offs
    real = row_ok[:, None] & (offs < GS) & (idx < n)
    scale = tl.load(scale_ptr + g, mask=row_ok, other=0.0)[:, None]
    if BITS == 8:
        c = tl.load(data_ptr + idx, mask=real, other=0).to(tl.int32)
        if not ASYM:
            c = tl.where(c > 127, c - 256, c)  # two's complement int8 stored as bytes
    else:
        byte = tl.load(data_ptr + g[:, None] * BPG + offs // 2, mask=real, other=0).to(tl.int32)
        c = (byte >> ((offs % 2) * 4)) & 0xF
        if not ASYM:
            c = c - 8
    v = c.to(tl.float32)
    if ASYM:
        v = v - tl.load(zp_ptr + g, mask=row_ok, other=0.0)[:, None]
    tl.store(out_ptr + idx, v * scale, mask=real)


@triton.jit
def dequant_fp8_kernel(
    data_ptr, scale_ptr, out_ptr, n, G,
    GS: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, M: tl.constexpr,
    BIAS: tl.constexpr, FN: tl.constexpr, SUB_STEP: tl.constexpr,
):  # fmt: skip
    g, row_ok = _rows(G, ROWS)
    offs = tl.arange(0, BLOCK)[None, :]
    idx = g[:, None] * GS + offs
    real = row_ok[:, None] & (offs < GS) & (idx < n)
    scale = tl.load(scale_ptr + g, mask=row_ok, other=0.0)[:, None]
    c = tl.load(data_ptr + idx, mask=real, other=0).to(tl.uint32)
    emask: tl.constexpr = (1 << (7 - M)) - 1
    e = (c >> M) & emask
    m = c & ((1 << M) - 1)
    normal = (((e + (127 - BIAS)) << 23) | (m << (23 - M))).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * SUB_STEP
    mag = tl.where(e == 0, sub, normal)
    if FN:
        mag = tl.where((c & 0x7F) == 0x7F, float("nan"), mag)
    else:
        mag = tl.where(e == emask, tl.where(m == 0, float("inf"), float("nan")), mag)
    val = (mag.to(tl.uint32, bitcast=True) | ((c & 0x80) << 24)).to(tl.float32, bitcast=True)
    tl.store(out_ptr + idx, val * scale, mask=real)
