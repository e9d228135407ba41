"""Converting one DeepSpeed checkpoint tag into a universal checkpoint tag (the passes of
:mod:`ds.checkpoint.universal_convert`, for ZeRO-1/2 and ZeRO-3 tags)."""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ds.checkpoint.deepspeed_layout import load_file
from ds.checkpoint.universal_autoep import (
    aggregate_zero12_metadata,
    consolidate_zero12_expert_states,
    expert_param_info,
)
from ds.checkpoint.universal_convert import (
    extract_zero3,
    extract_zero12,
    group_per_tp_shapes,
    merge_tp_slices,
    merge_zero3_slices,
    plain,
    save_optimizer_state_zero3,
    save_optimizer_state_zero12,
    write_missing_fp32,
    zero3_rank_grid,
)
from ds.checkpoint.universal_tp import check_conversion_supported
from ds.interfaces.errors import CheckpointError

UC_INFO = "universal_checkpoint_info"
AUTOEP_KEYS = ("ds_autoep_layers", "autoep_layers")
_AUTOEP = (
    "ZeRO-3 AutoEP expert layers are not converted to a universal checkpoint by ds; load the "
    "checkpoint at the expert-parallel degree it was saved with"
)
_AUTOEP_TP = (
    "ZeRO-1/2 universal conversion of AutoEP experts with tensor parallelism is not supported"
)


def zero_stage(optim_file: str) -> int:
    """The ZeRO stage an optimizer file was written at (1 when it does not say)."""
    return int(load_file(optim_file)["optimizer_state_dict"].get("zero_stage", 1))


def _merge_all(
    uc_info: Mapping[str, Any],
    out: str,
    temp: str,
    tp_degree: int,
    shapes: Mapping[str, Sequence[Any]],
    strict: bool,
) -> None:
    unused: set[str] | None = None
    for item in shapes.items():
        left = merge_tp_slices(uc_info, os.path.join(out, "zero"), temp, tp_degree, item)
        unused = left if unused is None else unused & left
    if unused and strict:
        raise AssertionError(f"Unused patterns={sorted(unused)} while merging tp slices")


def _finish(out: str, temp: str, keep_temp: bool) -> None:
    if not keep_temp:
        shutil.rmtree(temp, ignore_errors=True)
    root, tag = os.path.split(os.path.normpath(out))
    with open(os.path.join(root, "latest_universal"), "w") as f:
        f.write(tag)


def convert_zero12(layout: Any, out: str, *, strict: bool = True, keep_temp: bool = False) -> None:
    """A ZeRO-1/2 tag (opened as a :class:`~ds.checkpoint.deepspeed_3d.CheckpointLayout`).
    AutoEP expert weights (``[local_experts, ...]`` on each expert-parallel position) are
    stacked over all experts; the copied model-state files then name them in their
    universal-checkpoint info."""
    uc_info = layout.get_checkpoint_info(UC_INFO) or {}
    check_conversion_supported(uc_info)
    shapes_by_file, layers, data_first = aggregate_zero12_metadata(layout.model_state_metadata)
    experts = expert_param_info(layers) if layers is not None else {}
    if experts and layout.tp_degree != 1:
        raise NotImplementedError(_AUTOEP_TP)
    shapes = group_per_tp_shapes(shapes_by_file, layout.pp_degree, layout.tp_degree)
    temp = os.path.join(out, "tmp")
    for pp, tp, dp in itertools.product(
        range(layout.pp_degree), range(layout.tp_degree), range(layout.dp_degree)
    ):
        extract_zero12(temp, layout, pp, tp, dp)
    dense = {n: s for n, s in shapes.items() if n not in experts}
    _merge_all(uc_info, out, temp, layout.tp_degree, dense, strict)
    if experts:
        local = {n: shapes[n][0] for n in experts if n in shapes}
        consolidate_zero12_expert_states(
            temp, out, experts, local, layout.dp_degree, layout.tp_degree, data_first
        )
    write_missing_fp32(out, layout.mp_rank_files)
    save_optimizer_state_zero12(out, layout)
    for f in layout.mp_rank_files:
        if layers is None:
            shutil.copy2(f, out)
            continue
        state = plain(dict(load_file(f)))
        info = dict(state.get(UC_INFO) or {})
        info.update(
            {"expert_parameter_patterns": [r"\.experts\.w[123]$"], "ds_autoep_layers": layers}
        )
        state[UC_INFO] = info
        torch.save(state, os.path.join(out, os.path.basename(f)))
    _finish(out, temp, keep_temp)


def convert_zero3(
    model_files: Sequence[str],
    optim_files: Sequence[str],
    out: str,
    *,
    strict: bool = True,
    keep_temp: bool = False,
) -> None:
    """A ZeRO-3 tag: ``zero_pp_rank_<dp>_mp_rank_<tp>`` model and optimizer files."""
    states = [load_file(f) for f in model_files]
    if any(s.get(k) is not None for s in states for k in AUTOEP_KEYS):
        raise NotImplementedError(_AUTOEP)
    model_grid, tp_degree, dp_degree = zero3_rank_grid(model_files)
    optim_grid, tp_optim, dp_optim = zero3_rank_grid(optim_files)
    if (tp_degree, dp_degree) != (tp_optim, dp_optim):
        raise RuntimeError(
            "ZeRO-3 model/optimizer tp_degree or dp_degree mismatch: "
            f"model=({tp_degree},{dp_degree}), optim=({tp_optim},{dp_optim})"
        )
    shapes_grid = [list(load_file(model_grid[tp][0])["param_shapes"]) for tp in range(tp_degree)]
    uc_info = (states[0].get(UC_INFO) or {}) if tp_degree > 1 else {}
    check_conversion_supported(uc_info)
    temp = os.path.join(out, "tmp")
    for tp in range(tp_degree):
        for dp in range(dp_degree):
            extract_zero3(temp, optim_grid[tp][dp], shapes_grid[tp], dp_degree, tp, dp)
    names = {n for group in shapes_grid[0] for n in group}
    if tp_degree > 1:
        by_tp = [{n: s for group in grid for n, s in group.items()} for grid in shapes_grid]
        shapes = {n: [by_tp[tp][n] for tp in range(tp_degree)] for n in sorted(names)}
        _merge_all(uc_info, out, temp, tp_degree, shapes, strict)
    else:
        for n in sorted(names):
            merge_zero3_slices(dp_degree, os.path.join(out, "zero"), temp, n)
    save_optimizer_state_zero3(out, optim_files[0])
    for f in model_files:
        shutil.copy2(f, out)
    _finish(out, temp, keep_temp)


def convert(
    tag_dir: str,
    out: str,
    *,
    inject_missing_state: bool = False,
    strict: bool = True,
    keep_temp: bool = False,
) -> None:
    """A DeepSpeed checkpoint tag folder into a universal tag folder ``out`` (its parent gets
    ``latest_universal``). A tag whose writer recorded no universal-checkpoint info is refused
    unless ``inject_missing_state`` (then its parameters are taken as not tensor-parallel)."""
    from ds.checkpoint.deepspeed_3d import CheckpointLayout
    from ds.checkpoint.universal_tp import VERSION, VERSION_KEY

    names = sorted(os.listdir(tag_dir))
    optim = [os.path.join(tag_dir, n) for n in names if n.endswith("_optim_states.pt")]
    if not optim:
        raise FileNotFoundError(f"no *_optim_states.pt files in {tag_dir}")
    zero3 = [
        f for f in optim if os.path.basename(f).startswith(("zero_pp_rank_", "bf16_zero_pp_rank_"))
    ]
    if zero_stage((zero3 or optim)[0]) <= 2:
        layout = CheckpointLayout(tag_dir)
        if inject_missing_state and layout.get_checkpoint_info(UC_INFO) is None:
            layout.global_state[UC_INFO] = {VERSION_KEY: VERSION}
        if layout.get_checkpoint_info(UC_INFO) is None:
            raise CheckpointError(
                f"{tag_dir} records no {UC_INFO}; pass --inject-missing-state "
                "(inject_missing_state) to take its parameters as not tensor-parallel"
            )
        convert_zero12(layout, out, strict=strict, keep_temp=keep_temp)
        return
    model = [
        os.path.join(tag_dir, n)
        for n in names
        if n.endswith("_model_states.pt") and not (n.startswith("layer_") and "_expert_" in n)
    ]
    convert_zero3(model, zero3 or optim, out, strict=strict, keep_temp=keep_temp)


__all__ = ["convert", "convert_zero12", "convert_zero3", "zero_stage"]
