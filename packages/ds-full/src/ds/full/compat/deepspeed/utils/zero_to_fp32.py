"""``deepspeed.utils.zero_to_fp32``: consolidated fp32 weights from a DeepSpeed or ds checkpoint.

The same work as ``ds checkpoint export``: tensors are read one at a time from the shards.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any


def _natural_key(path: str) -> list[Any]:
    # rank 10 sorts after rank 9, not after rank 1
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path)]


def _checkpoint_files(checkpoint_dir: str, pattern: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(checkpoint_dir, pattern)), key=_natural_key)
    if not files:
        raise FileNotFoundError(f"can't find {pattern} files in directory '{checkpoint_dir}'")
    return files


def get_optim_files(checkpoint_dir: str) -> list[str]:
    """The ``*_optim_states.pt`` files of a tag, in rank order."""
    return _checkpoint_files(checkpoint_dir, "*_optim_states.pt")


def get_model_state_files(checkpoint_dir: str) -> list[str]:
    """The ``*_model_states.pt`` files of a tag, in rank order."""
    return _checkpoint_files(checkpoint_dir, "*_model_states.pt")


def get_fp32_state_dict_from_zero_checkpoint(
    checkpoint_dir: str,
    tag: str | None = None,
    exclude_frozen_parameters: bool = False,
    lazy_mode: bool = False,
) -> dict[str, Any]:
    from ds.checkpoint.deepspeed_format import consolidated_fp32_state_dict

    return consolidated_fp32_state_dict(
        checkpoint_dir, tag, exclude_frozen_parameters=exclude_frozen_parameters
    )


def convert_zero_checkpoint_to_fp32_state_dict(
    checkpoint_dir: str,
    output_dir: str,
    max_shard_size: str = "5GB",
    safe_serialization: bool = False,
    tag: str | None = None,
    exclude_frozen_parameters: bool = False,
) -> None:
    from ds.checkpoint.deepspeed_export import export_fp32

    export_fp32(
        checkpoint_dir,
        output_dir,
        tag=tag,
        max_shard_size=max_shard_size,
        safe_serialization=safe_serialization,
        exclude_frozen_parameters=exclude_frozen_parameters,
    )


def load_state_dict_from_zero_checkpoint(
    model: Any, checkpoint_dir: str, tag: str | None = None
) -> Any:
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model
