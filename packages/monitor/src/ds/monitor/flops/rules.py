"""FLOP rules per aten op, for the forward pass.

A multiply-accumulate (MAC) is two FLOPs. Only the ops whose cost grows faster than their output
(matrix products, convolutions, attention) are counted, the convention of Megatron-LM's and
PyTorch's flop counters; element-wise ops are memory-bound and would only blur MFU. Attention is
counted as its two matrix products (Q·Kᵀ and P·V) whatever kernel runs it, causal or not, so the
figure is comparable across backends (the fused CPU kernel included, which PyTorch's
``FlopCounterMode`` does not count).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

aten = torch.ops.aten
Shape = Sequence[int]


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape)


def _mm(args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    (m, k), (_, n) = _shape(args[0]), _shape(args[1])
    return m * k * n


def _addmm(args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    return _mm(args[1:], kwargs)


def _bmm(args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    (b, m, k), (_, _, n) = _shape(args[0]), _shape(args[1])
    return b * m * k * n


def _baddbmm(args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    return _bmm(args[1:], kwargs)


def _conv(args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    x, w = args[0], args[1]
    transposed = bool(args[6]) if len(args) > 6 else False
    out_spatial = _conv_out(x, w, args)
    batch = x.shape[0]
    if transposed:
        # Each input element scatters into kernel-sized outputs.
        return batch * math.prod(x.shape[2:]) * w.shape[0] * math.prod(w.shape[1:])
    return batch * math.prod(out_spatial) * w.shape[0] * math.prod(w.shape[1:])


def _conv_out(x: Any, w: Any, args: Sequence[Any]) -> list[int]:
    stride, padding, dilation = args[3], args[4], args[5]
    out = []
    for i, size in enumerate(x.shape[2:]):
        k = w.shape[2 + i]
        out.append((size + 2 * padding[i] - dilation[i] * (k - 1) - 1) // stride[i] + 1)
    return out


def _sdpa(args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    q, k, v = _shape(args[0]), _shape(args[1]), _shape(args[2])
    *batch, sq, d = q
    sk, dv = k[-2], v[-1]
    b = math.prod(batch)
    return b * sq * sk * d + b * sq * sk * dv


def _ops(*names: str) -> list[Any]:
    out = []
    for name in names:
        op = getattr(aten, name, None)
        if op is not None:
            out.append(op.default)
    return out


MACS: dict[Any, Callable[[Sequence[Any], dict[str, Any]], int]] = {}
for _op in _ops("mm"):
    MACS[_op] = _mm
for _op in _ops("addmm"):
    MACS[_op] = _addmm
for _op in _ops("bmm"):
    MACS[_op] = _bmm
for _op in _ops("baddbmm"):
    MACS[_op] = _baddbmm
for _op in _ops("convolution", "_convolution"):
    MACS[_op] = _conv
for _op in _ops(
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
):
    MACS[_op] = _sdpa


def macs_of(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    rule = MACS.get(func)
    return rule(args, kwargs) if rule is not None else 0
