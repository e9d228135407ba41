"""``linear(x, q, bias)``: ``x @ dequantize(q).T + bias`` for a weight-only quantized linear layer.

For a few rows of float32 activations on the CPU (a decode step: one row per sequence) the native
kernel reads ``q``'s integer codes directly and never writes a float copy of the weight; a step
then reads a quarter (int8) or an eighth (int4) of the weight's fp32 bytes. Otherwise (many
rows, where a dense GEMM on a dequantized copy is faster; fp8; another device or dtype; rows not
made of whole groups; activations that need a gradient; a weight whose arrays are not
contiguous) it dequantizes and calls ``torch.nn.functional.linear``.

``activations="int8"`` (opt-in: it changes the numerics) quantizes the activations per block of
one weight group and multiplies integer codes (VNNI / AVX2 / scalar variants of the kernel, at
every row count); where the kernel does not apply, :func:`ds.ops.quant.activations.linear`
computes the same math in torch.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F

from ds.interfaces.errors import ConfigError
from ds.interfaces.kernels import QuantizedTensor
from ds.ops.quant import activations as act
from ds.ops.quant._schemes import get_scheme

# Rows of x up to which the native kernel is used. Each block of 4 rows reads the codes once;
# past this a GEMM on the dequantized weight (read once, multiplied at GEMM speed) wins. On the
# SmolLM2-135M layers, one thread, AVX-512, CPU time (tools/bench/quant_linear.py): at 32 rows
# the kernel took 0.84x (int8) and 0.59x (int4) of dequantize + F.linear on cache-resident
# weights and 0.90x / 0.67x with 30 layers' weights streamed from L3; at 48 rows, cache-resident,
# still 0.92x / 0.74x.
MAX_NATIVE_ROWS = 32


# Per quantized weight (by id, dropped when the weight is collected): the kernel's prepared form,
# ds.ops._C.QLinearWeight (its arrays checked and bound once; a call then passes only the
# addresses of x and y), or None where the kernel cannot take the weight, with the version
# counters of its arrays when it was made. Binding the weight's three arrays every call took about
# 10 us, more than the kernel on a small decode layer.
#
# The int8-activation path reads a copy: its first call packs the codes 16 output rows at a time
# (ds::quant::A8Packed; QLinearWeight.a8_packed_bytes: about 1.11x the int8 weight's bytes, codes
# plus a scale and a correction per row and group, 1.0x for int4), so that weight then takes
# twice its memory. The stored arrays stay: the float-activation kernel, dequantize (the torch
# form for other dtypes and devices, and for inputs that need a gradient) and saving read them.
# An in-place update of the weight bumps its tensors' version counters, and the next call prepares
# (and packs) it again; inference tensors (made under torch.inference_mode) track no version, and
# their copy is not renewed after an in-place update.
_PREPARED: dict[int, tuple[Any, tuple[int, ...]]] = {}


def _arrays(q: QuantizedTensor) -> list[torch.Tensor]:
    return [q.data, q.scales] + ([q.zero_points] if q.zero_points is not None else [])


def _versions(q: QuantizedTensor) -> tuple[int, ...]:
    return tuple(t._version for t in _arrays(q) if not t.is_inference())


def _prepare(q: QuantizedTensor) -> Any:
    s = get_scheme(q.scheme)
    if s.kind != "int" or len(q.shape) != 2:
        return None
    # Contiguous as stored: a copy made here would miss later in-place updates of the weight.
    if any(t.device.type != "cpu" or not t.is_contiguous() for t in _arrays(q)):
        return None
    n, k = q.shape
    gs = q.group_size
    if k % gs != 0 or (s.bits == 4 and gs % 2 != 0):
        return None
    from ds.ops._native import native

    zps = q.zero_points if q.zero_points is not None else q.scales[:0]
    return native().QLinearWeight(
        q.data.view(torch.uint8), q.scales, zps, k, n, gs, s.bits, s.asym, s.qmin, s.qmax
    )


def _prepared(q: QuantizedTensor) -> Any:
    key = id(q)
    versions = _versions(q)
    entry = _PREPARED.get(key)
    if entry is not None and entry[1] == versions:
        return entry[0]
    w = _prepare(q)
    if entry is None:
        weakref.finalize(q, _PREPARED.pop, key, None)
    _PREPARED[key] = (w, versions)
    return w


def _x_native(x: torch.Tensor, q: QuantizedTensor) -> bool:
    if x.requires_grad and torch.is_grad_enabled():
        return False  # the kernel has no backward; F.linear on the dequantized weight has
    if x.dtype != torch.float32 or x.device.type != "cpu" or len(q.shape) != 2:
        return False
    return x.shape[-1] == q.shape[1] and x.numel() > 0


def _x_applies(x: torch.Tensor, q: QuantizedTensor, activations: str) -> bool:
    # int8 activations: every row count, so prefill and decode share their numerics.
    rows_ok = activations == "int8" or x.numel() // q.shape[1] <= MAX_NATIVE_ROWS
    return _x_native(x, q) and rows_ok


def native_applies(x: torch.Tensor, q: QuantizedTensor, activations: str = "float") -> bool:
    """Whether the native kernel computes ``linear(x, q, activations=activations)`` (see the
    module docstring)."""
    return _x_applies(x, q, activations) and _prepared(q) is not None


def _run(prepared: Any, x: torch.Tensor, q: QuantizedTensor, bias: torch.Tensor | None,
         int8_x: bool) -> torch.Tensor:  # fmt: skip
    n, k = q.shape
    # A decode step's x is already (rows, k) and contiguous; reshaping and viewing back cost a
    # microsecond each, a tenth of a small layer's whole call.
    flat = x if x.dim() == 2 and x.is_contiguous() else x.detach().reshape(-1, k)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    y = torch.empty(flat.shape[0], n, dtype=torch.float32)
    # Both checked by _x_applies and alive through the call: float32, CPU, contiguous, m x k and
    # m x n.
    prepared.run(flat.data_ptr(), flat.shape[0], y.data_ptr(), int8_x)
    if bias is not None:
        y += bias
    return y if x.dim() == 2 else y.view(*x.shape[:-1], n)


def linear(
    x: torch.Tensor,
    q: QuantizedTensor,
    bias: torch.Tensor | None = None,
    *,
    impl: str = "auto",
    activations: str = "float",
) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W = dequantize(q)`` (``q`` of shape ``(out, in)``); ``impl`` as
    for :func:`ds.ops.quant.dequantize` (``reference`` never uses the native kernel).

    ``activations="int8"`` quantizes ``x`` too, per block of one weight group (symmetric
    int8_sym / int4_sym weights only; see :mod:`ds.ops.quant.activations`), and sums exact
    integer products per group: cheaper, and off from the float result by the activations'
    rounding (up to ``max|x| / 254`` per element of each block)."""
    if activations not in ("float", "int8"):
        raise ConfigError(f"activations must be 'float' or 'int8', got {activations!r}")
    if activations == "int8":
        act.check_weight(q)
    if impl != "reference" and _x_applies(x, q, activations):
        prepared = _prepared(q)
        if prepared is not None:
            return _run(prepared, x, q, bias, activations == "int8")
    if activations == "int8":
        return act.linear(x, q, bias)
    from ds.ops import quant

    w = quant.dequantize(q, x.dtype, impl=impl)  # type: ignore[arg-type]
    return F.linear(x, w, bias)
