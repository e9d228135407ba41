"""Device visibility variables per accelerator, decided without importing torch.

The launcher parent must start fast, so it does not load an accelerator (which imports torch).
The variable names match what each device runtime reads.
"""

from __future__ import annotations

import os
from pathlib import Path

VISIBLE_DEVICES_ENV: dict[str, list[str]] = {
    "cuda": ["CUDA_VISIBLE_DEVICES"],
    "rocm": ["HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"],
    "xpu": ["ZE_AFFINITY_MASK"],
    "hpu": ["HABANA_VISIBLE_MODULES"],
    "npu": ["ASCEND_RT_VISIBLE_DEVICES"],
    "cpu": [],
    "mps": [],
}


def detect_accelerator() -> str:
    """``DS_ACCELERATOR`` when set, else cuda when an NVIDIA/AMD driver exposes devices, else cpu."""
    forced = os.environ.get("DS_ACCELERATOR")
    if forced:
        return forced.lower()
    if gpu_count("cuda") > 0:
        return "cuda"
    if Path("/dev/kfd").exists():
        return "rocm"
    return "cpu"


def gpu_count(kind: str) -> int:
    if kind == "cuda":
        drv = Path("/proc/driver/nvidia/gpus")
        if drv.is_dir():
            return sum(1 for _ in drv.iterdir())
        return sum(1 for p in Path("/dev").glob("nvidia[0-9]*"))
    return 0


def visible_device_vars(kind: str) -> list[str]:
    return list(VISIBLE_DEVICES_ENV.get(kind, []))
