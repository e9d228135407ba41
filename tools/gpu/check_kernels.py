"""Every Triton kernel of ds against its pure-torch reference, and the bandwidth rows: fused Adam
as a fraction of the device's measured copy bandwidth, paged-attention decode as a fraction of
the same (HBM) bandwidth.

On a GPU the kernels are compiled for real; on the CPU (the dry run) they run through
``TRITON_INTERPRET=1`` at tiny sizes, which check.py sets before any kernel is defined.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

TOL = {torch.float32: 1e-6, torch.bfloat16: 2**-7, torch.float16: 2**-10}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    """Median seconds of ``fn`` over ``reps`` runs after one warm-up (device events on CUDA)."""
    fn()
    _sync(device)
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


# -- optimizers --------------------------------------------------------------------------------
def optimizer(kind: str, dtype: torch.dtype, n: int, steps: int, device: torch.device) -> dict:
    from ds.ops import reference
    from ds.ops.triton import adagrad, adam, lion

    gen = torch.Generator().manual_seed(n)
    p = torch.randn(n, generator=gen).to(dtype).to(device)
    states = 2 if kind == "adam" else 1
    s = [torch.zeros(n, dtype=torch.float32, device=device) for _ in range(states)]
    rp, rs = p.clone(), [t.clone() for t in s]
    for step in range(1, steps + 1):
        g = torch.randn(n, generator=gen).to(dtype).to(device)
        if kind == "adam":
            kw: dict[str, Any] = {"step": step, "lr": 1e-2, "weight_decay": 0.05}
            adam.adam_step(p, g, *s, **kw)
            reference.adam_step(rp, g, *rs, **kw)
        elif kind == "lion":
            lion.lion_step(p, g, *s, lr=1e-3, weight_decay=0.1)
            reference.lion_step(rp, g, *rs, lr=1e-3, weight_decay=0.1)
        else:
            adagrad.adagrad_step(p, g, *s, lr=1e-2, weight_decay=0.01)
            reference.adagrad_step(rp, g, *rs, lr=1e-2, weight_decay=0.01)
    _sync(device)
    rel = (p.float() - rp.float()).abs() / (1 + rp.float().abs())
    # The same fp32 math in another operation order: a few ulps of the storage dtype per step.
    # Lion's sign() may flip where the momentum mix is within an ulp of 0: rare single elements.
    beyond = float((rel > 4 * TOL[dtype] * steps).float().mean())
    return {
        "value": float(rel.max()),
        "unit": "max rel err",
        "fraction_beyond_tol": beyond,
        "ok": beyond <= 1e-5,
    }


# -- quantization, SwiGLU, paged attention ------------------------------------------------------
def quantization(scheme: str, n: int, device: torch.device) -> dict:
    from ds.ops.quant import reference
    from ds.ops.triton import quant

    x = torch.randn(n, generator=torch.Generator().manual_seed(1)).to(device)
    got = quant.quantize(x, scheme, 64)
    want = reference.quantize(x, scheme, 64)
    codes_equal = bool(
        torch.equal(got.data.cpu().view(torch.uint8), want.data.cpu().view(torch.uint8))
    )
    scales = float((got.scales.float() - want.scales.float()).abs().max())
    back = quant.dequantize(got)
    ref_back = reference.dequantize(want)
    err = float((back.float() - ref_back.float()).abs().max())
    return {
        "value": err,
        "unit": "max abs diff (dequantized)",
        "codes_equal": codes_equal,
        "ok": codes_equal and scales <= 1e-6 and err <= 1e-6,
    }


def swiglu(n: int, device: torch.device) -> dict:
    from ds.ops.triton import swiglu as tri
    from ds.ops.triton import swiglu_reference as ref

    g = torch.Generator().manual_seed(2)
    a = torch.randn(n, generator=g).to(device).requires_grad_()
    b = torch.randn(n, generator=g).to(device).requires_grad_()
    up = torch.randn(n, generator=g).to(device)
    out = tri.swiglu(a, b)
    out.backward(up)
    da, db = ref.swiglu_backward(up, a.detach(), b.detach())
    fwd = float((out.detach() - ref.swiglu(a.detach(), b.detach())).abs().max())
    bwd = max(float((a.grad - da).abs().max()), float((b.grad - db).abs().max()))  # type: ignore[operator]
    return {"value": max(fwd, bwd), "unit": "max abs diff (fwd, bwd)", "ok": max(fwd, bwd) <= 1e-5}


def _decode_batch(
    seqs: int, ctx: int, heads: int, kv_heads: int, dim: int, block: int, dtype: torch.dtype,
    device: torch.device, prefill: bool = False,
) -> tuple[Any, ...]:  # fmt: skip
    """A paged cache and a ragged batch: ``seqs`` decodes at context ``ctx`` in scattered blocks
    (with ``prefill`` also a prompt chunk continuing a cached prefix)."""
    from ds.inference.attention import write_kv
    from ds.inference.ragged import build_ragged_batch

    g = torch.Generator().manual_seed(3)
    seen = [ctx - 1] * seqs + ([block + 3] if prefill else [])
    new = [1] * seqs + ([7] if prefill else [])
    need = [-(-(s + n) // block) for s, n in zip(seen, new, strict=True)]
    perm = torch.randperm(sum(need), generator=g).tolist()
    blocks, used = [], 0
    for nb in need:
        blocks.append(perm[used : used + nb])
        used += nb
    k_cache = torch.randn(kv_heads, sum(need), block, dim, generator=g).to(dtype).to(device)
    v_cache = torch.randn(kv_heads, sum(need), block, dim, generator=g).to(dtype).to(device)
    batch = build_ragged_batch([[0] * n for n in new], seen, blocks, block, device=device)
    t = batch.num_tokens
    q = torch.randn(t, heads, dim, generator=g).to(dtype).to(device)
    k = torch.randn(t, kv_heads, dim, generator=g).to(dtype).to(device)
    v = torch.randn(t, kv_heads, dim, generator=g).to(dtype).to(device)
    write_kv(k_cache, v_cache, k, v, batch.slot_mapping)
    return q, k_cache, v_cache, batch


def paged_attention(device: torch.device, dtype: torch.dtype, tiny: bool) -> dict:
    from ds.inference.attention import paged_attention as reference
    from ds.inference.triton_attention import paged_attention_triton

    shape = (3, 40, 4, 2, 16, 16) if tiny else (16, 1000, 32, 8, 128, 16)
    q, kc, vc, batch = _decode_batch(*shape, dtype, device, prefill=True)
    scale = shape[4] ** -0.5
    got = paged_attention_triton(q, kc, vc, batch, scale)
    want = reference(q, kc, vc, batch, scale)
    err = float((got.float() - want.float()).abs().max())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    return {"value": err, "unit": "max abs diff", "ok": err <= tol}


# -- bandwidth ---------------------------------------------------------------------------------
def copy_bandwidth(device: torch.device, nbytes: int, reps: int) -> dict:
    """Device-to-device copy, bytes read plus written per second: the HBM figure used below."""
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    y = torch.empty_like(x)
    t = timed(lambda: y.copy_(x), device, reps)
    bw = 2 * nbytes / t
    return {"value": bw / 1e9, "unit": "GB/s", "bytes_per_s": bw, "ok": bw > 0}


def adam_bandwidth(device: torch.device, n: int, reps: int, copy_bw: float | None) -> dict:
    """Fused AdamW on fp32 params, grads and moments: 28 bytes moved per element (params, m, v
    read and written, grads read)."""
    from ds.ops.triton import adam

    p, g, m, v = (torch.randn(n, device=device) for _ in range(4))
    v.abs_()
    step = [0]

    def one() -> None:
        step[0] += 1
        adam.adam_step(p, g, m, v, step=step[0], lr=1e-4, weight_decay=0.01)

    t = timed(one, device, reps)
    bw = 28 * n / t
    row: dict[str, Any] = {"value": None, "unit": "of copy bandwidth", "adam_GB_per_s": bw / 1e9}
    if copy_bw:
        row["value"] = bw / copy_bw
        row["ok"] = row["value"] >= 0.9
    return row


def decode_bandwidth(device: torch.device, tiny: bool, reps: int, copy_bw: float | None) -> dict:
    """The Triton paged-attention kernel on a decode batch: KV bytes read once per step over the
    step's time, as a fraction of the measured copy bandwidth."""
    from ds.inference.triton_attention import paged_attention_triton

    seqs, ctx, heads, kvh, dim, block = (
        (2, 40, 4, 2, 16, 16) if tiny else (64, 4096, 32, 8, 128, 16)
    )
    dtype = torch.bfloat16
    q, kc, vc, batch = _decode_batch(seqs, ctx, heads, kvh, dim, block, dtype, device)
    scale = dim**-0.5
    t = timed(lambda: paged_attention_triton(q, kc, vc, batch, scale), device, reps)
    kv_bytes = 2 * seqs * ctx * kvh * dim * kc.element_size()
    bw = kv_bytes / t
    row: dict[str, Any] = {"value": None, "unit": "of copy bandwidth", "kv_GB_per_s": bw / 1e9,
                           "shape": f"{seqs} seqs x {ctx} ctx, {heads}/{kvh} heads, d {dim}"}  # fmt: skip
    if copy_bw:
        row["value"] = bw / copy_bw
        row["ok"] = row["value"] >= 0.7
    return row
