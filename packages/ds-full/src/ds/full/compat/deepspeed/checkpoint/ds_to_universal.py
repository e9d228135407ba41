"""``deepspeed.checkpoint.ds_to_universal``: converts a DeepSpeed ZeRO checkpoint tag into the
universal layout (``zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt``) that resumes at another
data- or tensor-parallel degree. The work is :mod:`ds.checkpoint.universal_main`'s; this module
keeps DeepSpeed's command line and entry points.

ds's own engine needs no conversion to load a DeepSpeed ZeRO checkpoint at another world size
(``engine.load_checkpoint`` reads it directly); converting serves DeepSpeed-format consumers and
tensor-parallel resumes."""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from ds.checkpoint.deepspeed_3d import CheckpointLayout as DeepSpeedCheckpoint

# DeepSpeed's private names for these steps, which its tools import
from ds.checkpoint.universal_autoep import (  # noqa: F401
    aggregate_zero12_metadata as _aggregate_autoep_zero12_metadata,
)
from ds.checkpoint.universal_convert import (  # noqa: F401
    group_per_tp_shapes as _group_per_tp_shapes,
)
from ds.checkpoint.universal_convert import merge_tp_slices, merge_zero_shards
from ds.checkpoint.universal_main import convert_zero3, convert_zero12
from ds.checkpoint.universal_main import zero_stage as _zero_stage_of
from ds.checkpoint.universal_tp import VERSION, VERSION_KEY
from ds.checkpoint.universal_tp import (
    check_conversion_supported as _validate_autotp_conversion_support,
)
from ds.full.compat.deepspeed.utils.zero_to_fp32 import (
    get_model_state_files as _get_model_state_files,
)
from ds.full.compat.deepspeed.utils.zero_to_fp32 import get_optim_files as _get_optim_files

UC_INFO = "universal_checkpoint_info"
_merge_zero_shards = merge_zero_shards


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Convert a DeepSpeed checkpoint to a universal one")
    p.add_argument("--input_folder", type=str, required=True, help="the checkpoint tag folder")
    p.add_argument("--output_folder", type=str, required=True, help="the universal tag folder")
    p.add_argument("--num_extract_workers", type=int, default=4)
    p.add_argument("--num_merge_workers", type=int, default=2)
    p.add_argument("--keep_temp_folder", action="store_true")
    p.add_argument("--no_strict", dest="strict", action="store_false")
    p.add_argument("--inject_missing_state", action="store_true")
    return p.parse_args(argv)


def _filter_zero3_optim_files(optim_files: list[str]) -> list[str]:
    return [f for f in optim_files if re.match(r"(?:bf16_)?zero_pp_rank_", os.path.basename(f))]


def _get_zero_stage(optim_files: list[str]) -> int:
    return _zero_stage_of(optim_files[0])


def _is_expert_model_state_file(path: str) -> bool:
    name = os.path.basename(path)
    return name.startswith("layer_") and "_expert_" in name


def _inject_missing_state(ds_checkpoint: Any) -> None:
    """A checkpoint written without universal-checkpoint info gets the default one."""
    if ds_checkpoint.get_checkpoint_info(UC_INFO) is None:
        ds_checkpoint.global_state[UC_INFO] = {VERSION_KEY: VERSION}


def _check_for_required_state(ds_checkpoint: Any) -> None:
    info = ds_checkpoint.get_checkpoint_info(UC_INFO)
    if info is None:
        raise AssertionError(
            f"Required {UC_INFO} state is missing in checkpoint; pass --inject_missing_state to "
            "convert a checkpoint whose writer did not record it"
        )
    _validate_autotp_conversion_support(info)


def main(args: Any) -> None:
    optim_files = _get_optim_files(args.input_folder)
    zero3_files = _filter_zero3_optim_files(optim_files)
    stage = _get_zero_stage(zero3_files or optim_files)
    strict = getattr(args, "strict", True)
    keep = getattr(args, "keep_temp_folder", False)
    if stage <= 2:
        ds_checkpoint = DeepSpeedCheckpoint(args.input_folder)
        if getattr(args, "inject_missing_state", False):
            _inject_missing_state(ds_checkpoint)
        _check_for_required_state(ds_checkpoint)
        convert_zero12(ds_checkpoint, args.output_folder, strict=strict, keep_temp=keep)
        return
    model_files = [
        f for f in _get_model_state_files(args.input_folder) if not _is_expert_model_state_file(f)
    ]
    convert_zero3(
        model_files, zero3_files or optim_files, args.output_folder, strict=strict, keep_temp=keep
    )


__all__ = [
    "DeepSpeedCheckpoint",
    "main",
    "merge_tp_slices",
    "parse_arguments",
]

if __name__ == "__main__":
    main(parse_arguments())
