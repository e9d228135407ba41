"""``linear(x, weight, bias)`` for an fp16 or fp32 weight and a few rows of activations on the CPU.

The native kernel ``linear_few_rows`` reads the weight in its stored form once per call (an fp16
weight converted in registers: F16C / AVX-512 ``vcvtph2ps``, bit arithmetic in the scalar variant)
and multiplies in fp32 against fp32 activations (fp16 ``x`` is converted first, exactly). Sums run
in fp32; the result is rounded once to ``x``'s dtype. Rows of the weight are split over the kernel
pool, sized to ``torch.get_num_threads()``.

A decode step (one row of activations per sequence) is bound by the bytes of weight it reads:
fp16 reads half of fp32's bytes, yet torch's own fp16 matrix-vector product on the CPU took as long
as its fp32 one; and torch's fp32 GEMM (MKL) at a few rows is far from reading its weight once.
Past :data:`MAX_NATIVE_ROWS` (fp16) or :data:`MAX_NATIVE_ROWS_FP32` rows torch is the faster
path (or was not measured); callers decide with :func:`applies`.
"""

from __future__ import annotations

import torch

from ds.interfaces.errors import KernelError

# Rows of x up to which the kernel beats F.linear on the fp16 weight. Each block of 4 rows
# converts the weight's vectors again (from L1: a tile of 4 rows of W is read from memory once
# for all blocks). SmolLM2-135M's 30 layers, one thread, AVX-512 (tools/bench/half_linear.py,
# CPU time): 23.7 / 26.2 / 51.8 / 87.1 ms at 1 / 4 / 16 / 32 rows against torch fp16's 34.1 /
# 53.5 / 67.8 / 81.0; its 49152 x 576 head 4.5 / 12.4 ms at 1 / 16 rows against 9.7 / 14.7.
MAX_NATIVE_ROWS = 16
# The same for an fp32 weight against torch's fp32 F.linear (MKL), same bench (--weights fp32):
# the 30 layers 31.7 / 34.3 / 40.5 / 56.4 / 89.7 ms at 1 / 4 / 8 / 16 / 32 rows against 32.2 /
# 54.0 / 69.8 / 75.9 / 102.2; the head 7.3 / 7.3 / 8.3 / 11.7 / 20.3 against 7.9 / 15.5 / 25.1 /
# 19.1 / 27.9. Past 32 rows it was not measured.
MAX_NATIVE_ROWS_FP32 = 32
_MAX_ROWS = {torch.float16: MAX_NATIVE_ROWS, torch.float32: MAX_NATIVE_ROWS_FP32}

_X_DTYPES = (torch.float16, torch.float32)


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`linear` takes ``x`` against ``weight`` and is the faster path: a
    contiguous 2-D CPU weight (read in place), fp16 with fp16 / fp32 ``x`` of at most
    :data:`MAX_NATIVE_ROWS` rows or fp32 with fp32 ``x`` of at most :data:`MAX_NATIVE_ROWS_FP32`
    rows, ``x`` on the CPU with ``in_features`` last, and no gradient wanted (the kernel has no
    backward)."""
    limit = _MAX_ROWS.get(weight.dtype)
    if limit is None or x.dtype not in _X_DTYPES:
        return False
    if weight.dtype == torch.float32 and x.dtype != torch.float32:  # torch would refuse the mix
        return False
    # is_cpu: 0.05 against 0.26 us for device.type, and a decode step asks this 200 times.
    if not (x.is_cpu and weight.is_cpu) or weight.dim() != 2:
        return False
    if not weight.is_contiguous():  # linear() would copy it every call
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return False
    k = weight.shape[1]
    return x.dim() >= 1 and x.shape[-1] == k and x.numel() <= limit * max(k, 1)


def _refuse(why: str) -> KernelError:
    return KernelError(f"half_linear: {why}")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` with ``weight`` [out, in] fp16 or fp32 on the CPU, ``x`` [..., in]
    fp16 or fp32, ``bias`` [out] fp16 / fp32 or None; the result has ``x``'s dtype. Any number of
    rows (the kernel is the fast path only up to a few: :func:`applies`); raises KernelError for
    inputs it does not take (other dtypes or devices, mismatched shapes, gradients)."""
    if weight.dtype not in _X_DTYPES or not weight.is_cpu or weight.dim() != 2:
        raise _refuse(
            f"the weight must be a 2-D fp16 or fp32 CPU tensor; got {tuple(weight.shape)} "
            f"{weight.dtype} on {weight.device}"
        )
    n, k = weight.shape
    if x.dtype not in _X_DTYPES or not x.is_cpu or x.dim() < 1 or x.shape[-1] != k:
        raise _refuse(
            f"x must be fp16 or fp32 on the CPU with {k} features last; got "
            f"{tuple(x.shape)} {x.dtype} on {x.device}"
        )
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        raise _refuse("the kernel has no backward; call it under torch.no_grad()")
    if bias is not None and (bias.dtype not in _X_DTYPES or not bias.is_cpu or bias.shape != (n,)):
        raise _refuse(
            f"bias must be fp16 or fp32 of shape ({n},) on the CPU; got {tuple(bias.shape)} "
            f"{bias.dtype} on {bias.device}"
        )
    w = weight if weight.is_contiguous() else weight.contiguous()
    # A decode step's x is already (rows, k) and contiguous: no reshape then (each costs about a
    # microsecond, a tenth of a small layer's call).
    flat = x if x.dim() == 2 and x.is_contiguous() else x.reshape(-1, k).contiguous()
    b = bias if bias is None or bias.is_contiguous() else bias.contiguous()
    from ds.ops._native import native, sync_threads

    sync_threads()
    m = flat.shape[0]
    y = torch.empty(m, n, dtype=x.dtype)
    half = x.dtype == torch.float16
    native().linear_few_rows(
        flat.data_ptr(), half, m, k, w.data_ptr(), w.dtype == torch.float16, n,
        0 if b is None else b.data_ptr(), b is not None and b.dtype == torch.float16,
        y.data_ptr(),
    )  # fmt: skip
    return y if x.dim() == 2 else y.view(*x.shape[:-1], n)
