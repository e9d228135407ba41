"""``deepspeed.git_version_info``: the DeepSpeed version whose API ds serves (0.19.8), ds's own
version, and which ops are usable (from ds's prebuilt kernels; nothing is compiled)."""

from __future__ import annotations

from typing import Any

import torch

from ds.full.compat._hook import API_LEVEL, _ds_version

version = API_LEVEL
ds_version = _ds_version()
git_hash = f"ds-{ds_version}"
git_branch = "ds"
accelerator_name = "cuda" if torch.cuda.is_available() else "cpu"
torch_info = {
    "version": ".".join(torch.__version__.split("+")[0].split(".")[:2]),
    "bf16_support": bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported()),
    "cuda_version": torch.version.cuda or "0.0",
    "nccl_version": "0.0",
    "hip_version": getattr(torch.version, "hip", None) or "0.0",
}


def __getattr__(name: str) -> Any:
    # Probing the ops imports the kernels; done on first use only.
    if name in ("installed_ops", "compatible_ops"):
        import ds.full.compat.deepspeed.ops as ops

        return dict(ops.__compatible_ops__)
    raise AttributeError(f"deepspeed.git_version_info.{name} has no ds equivalent")


__all__ = ["accelerator_name", "ds_version", "git_branch", "git_hash", "torch_info", "version"]
