"""The quantization schemes, their constants, and validation shared by every implementation.

Layout (identical for the reference, native and Triton implementations, so their outputs can be
compared byte for byte): the input is flattened to ``n`` elements and split into
``G = ceil(n / group_size)`` groups; the last group is padded with the encoding of 0.0.

* ``data`` is one-dimensional: ``G * group_size`` codes (int8, uint8 or float8), or for int4
  ``G * ceil(group_size / 2)`` bytes, each group packed on its own (element 2i in the low nibble,
  2i+1 in the high nibble).
* ``scales`` is float32 of length ``G``; ``zero_points`` (asymmetric schemes only) is float32 of
  length ``G`` holding integers in ``[0, qmax]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ds.interfaces.errors import ConfigError, KernelError


@dataclass(frozen=True)
class Scheme:
    name: str
    kind: str  # "int" or "fp8"
    bits: int
    asym: bool
    qmin: int  # integer schemes: code range after adding the zero point
    qmax: int
    fp8_max: float  # fp8 schemes: largest finite magnitude
    data_dtype: torch.dtype


SCHEMES: dict[str, Scheme] = {
    "int8_sym": Scheme("int8_sym", "int", 8, False, -127, 127, 0.0, torch.int8),
    "int8_asym": Scheme("int8_asym", "int", 8, True, 0, 255, 0.0, torch.uint8),
    "int4_sym": Scheme("int4_sym", "int", 4, False, -7, 7, 0.0, torch.uint8),
    "int4_asym": Scheme("int4_asym", "int", 4, True, 0, 15, 0.0, torch.uint8),
    "fp8_e4m3": Scheme("fp8_e4m3", "fp8", 8, False, 0, 0, 448.0, torch.float8_e4m3fn),
    "fp8_e5m2": Scheme("fp8_e5m2", "fp8", 8, False, 0, 0, 57344.0, torch.float8_e5m2),
}

FLOAT_INPUTS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def get_scheme(scheme: str) -> Scheme:
    try:
        return SCHEMES[scheme]
    except (KeyError, TypeError):
        raise ConfigError(
            f"unknown quantization scheme {scheme!r}; use one of {', '.join(SCHEMES)}"
        ) from None


def check_group_size(group_size: object) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise ConfigError(
            f"group_size must be a positive int, got {group_size!r}; typical values are 64-4096"
        )
    return group_size


def check_input(x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise KernelError(f"quantize expects a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_INPUTS:
        raise KernelError(
            f"quantize expects a floating-point tensor (float32, float16, bfloat16 or float64), "
            f"got {x.dtype}; convert it with .float() first"
        )
    if x.numel() == 0:
        raise KernelError("quantize got an empty tensor; there is nothing to quantize")
    return x


def check_quantize_args(x: object, scheme: str, group_size: object) -> Scheme:
    """What every quantizer checks of its arguments, in one order (so all of them refuse the
    same call with the same error); returns the scheme."""
    s = get_scheme(scheme)
    check_group_size(group_size)
    check_input(x)
    return s


def num_groups(n: int, group_size: int) -> int:
    return (n + group_size - 1) // group_size


def bytes_per_group(s: Scheme, group_size: int) -> int:
    return (group_size + 1) // 2 if s.bits == 4 else group_size
