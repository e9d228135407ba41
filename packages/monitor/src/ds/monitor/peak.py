"""Peak dense FLOP/s of an accelerator, for MFU.

Vendor datasheet figures for dense (not sparse) tensor-core math on GPUs. On a CPU the peak is
measured (``ds.monitor.ceiling``: torch GEMM at the process's thread count, cached per host, torch
version and thread count; ``ds bench peak`` measures and prints it). ``DS_PEAK_TFLOPS`` overrides
both (per device, in TFLOP/s), which is also how an unlisted device gets an MFU.
"""

from __future__ import annotations

import os

import torch

from ds.monitor.ceiling import ceiling, dtype_key

# (substring of torch.cuda.get_device_name(), {dtype: TFLOP/s})
_GPUS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("H100", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("H800", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("B200", {"bf16": 2250.0, "fp16": 2250.0, "fp32": 80.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    ("A800", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.0, "fp16": 362.0, "fp32": 91.6}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2}),
    ("V100", {"bf16": 0.0, "fp16": 125.0, "fp32": 15.7}),
    ("MI300X", {"bf16": 1307.0, "fp16": 1307.0, "fp32": 163.4}),
)


def peak_flops(device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> float | None:
    """Peak FLOP/s of one device for ``dtype``, or ``None`` when unknown."""
    return peak_flops_source(device, dtype)[0]


def peak_flops_source(
    device: torch.device | str, dtype: torch.dtype = torch.bfloat16
) -> tuple[float | None, str]:
    """``(peak FLOP/s or None, where it comes from)``: ``DS_PEAK_TFLOPS``, ``datasheet``,
    ``measured`` (a CPU, by this process's thread count) or ``unknown``."""
    override = os.environ.get("DS_PEAK_TFLOPS")
    if override:
        try:
            return float(override) * 1e12, "DS_PEAK_TFLOPS"
        except ValueError:
            raise ValueError(
                f"DS_PEAK_TFLOPS={override!r} is not a number; set it to the peak TFLOP/s "
                "of one device, e.g. DS_PEAK_TFLOPS=989"
            ) from None
    device = torch.device(device)
    key = dtype_key(dtype)
    if device.type == "cpu":
        if os.environ.get("DS_PEAK_MEASURE", "1") == "0":
            return None, "unknown"
        return float(ceiling(dtypes=(key,))["flops"][key]), "measured"
    if device.type != "cuda" or not torch.cuda.is_available():
        return None, "unknown"
    name = torch.cuda.get_device_name(device)
    for gpu, table in _GPUS:
        if gpu in name:
            value = table.get(key, 0.0)
            return (value * 1e12, "datasheet") if value else (None, "unknown")
    return None, "unknown"
