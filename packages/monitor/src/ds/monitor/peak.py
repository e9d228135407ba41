"""Peak dense FLOP/s of an accelerator, for MFU.

Vendor datasheet figures for dense (not sparse) tensor-core math. ``DS_PEAK_TFLOPS`` overrides
(per device, in TFLOP/s), which is also how a CPU or an unlisted device gets an MFU: a CPU's
peak depends on its cores, clocks and vector units, which no portable API reports.
"""

from __future__ import annotations

import os

import torch

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


def _dtype_key(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def peak_flops(device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> float | None:
    """Peak FLOP/s of one device for ``dtype``, or ``None`` when unknown."""
    override = os.environ.get("DS_PEAK_TFLOPS")
    if override:
        return float(override) * 1e12
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    for key, table in _GPUS:
        if key in name:
            value = table.get(_dtype_key(dtype), 0.0)
            return value * 1e12 if value else None
    return None
