"""The parallel layout of a DeepSpeed checkpoint tag saved with pipeline and/or tensor
parallelism: which files it holds, the (pp, tp, dp) degrees they were written at, and the ZeRO
files each rank of a smaller layout reads.

Model-state files (``mp_rank_XX_model_states.pt``) are opened once each; only the small
metadata a converter needs is kept (parallel degrees, parameter shapes, AutoEP layer records, the
expert-ordering flag), so a large checkpoint is never held in memory whole.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ds.checkpoint.deepspeed_layout import load_file
from ds.checkpoint.rank_layout import ParallelDegrees, RankMap2D, reshape_2d

PARALLEL_DIMS = "checkpoint_parallel_dimensions"
PP_DEGREE = "pp_degree"
TP_DEGREE = "tp_degree"
PARAM_SHAPES = "param_shapes"
AUTOEP_LAYERS = "ds_autoep_layers"
AUTOEP_LAYERS_LEGACY = "autoep_layers"
DATA_BEFORE_EXPERT = "use_data_before_expert_parallelism"
GLOBAL_KEYS = ("args", "checkpoint_info", "universal_checkpoint_info")
# what a converter needs of each AutoEP layer record (the rest can be large)
AUTOEP_FIELDS = (
    "moe_layer_id",
    "module_path",
    "expert_key_prefix",
    "num_experts",
    "num_local_experts",
    "ep_size",
)
ZERO_PREFIXES = ("zero_pp_rank_", "fp16_zero_pp_rank_", "bf16_zero_pp_rank_")
_LAYER_FILE = re.compile(r"layer_(\d+)-model_.*")


def all_files(directory: str) -> list[str]:
    return [os.path.join(root, f) for root, _, files in os.walk(directory) for f in files]


def files_with_prefix(files: Sequence[str], prefix: str) -> list[str]:
    return sorted(f for f in files if os.path.basename(f).startswith(prefix))


def zero_files(directory: str) -> list[str]:
    """The ZeRO optimizer files of a tag, ordered by (data-parallel rank, model-parallel rank)."""
    files = all_files(directory)
    for prefix in ZERO_PREFIXES:
        found = files_with_prefix(files, prefix)
        if found:
            pattern = re.compile(rf"{prefix}(\d+)_mp_rank_(\d+)")
            ranked = []
            for f in found:
                m = pattern.search(f)
                if m is None:
                    raise ValueError(f"Cannot parse dp_rank and mp_rank from {f}")
                ranked.append((int(m.group(1)), int(m.group(2)), f))
            return [f for _, _, f in sorted(ranked)]
    return []


def _summary(value: Any, keep: Any) -> Any:
    """``keep(value)`` for a well-formed value, else the type's name (so a converter can name
    the malformed entry without holding it)."""
    return value if value is None else keep(value)


def model_state_metadata(state: Mapping[str, Any]) -> dict[str, Any]:
    """What a converter reads of one model-state file."""
    dims = state.get(PARALLEL_DIMS)
    shapes = state.get(PARAM_SHAPES)
    autoep = state.get(AUTOEP_LAYERS)
    if autoep is None:
        autoep = state.get(AUTOEP_LAYERS_LEGACY)
    cfg = state.get("ds_config", {})
    out: dict[str, Any] = {
        PARALLEL_DIMS: _summary(
            dims,
            lambda d: (
                {k: d.get(k) for k in (PP_DEGREE, TP_DEGREE)}
                if isinstance(d, Mapping)
                else type(d).__name__
            ),
        ),
        PARAM_SHAPES: _summary(
            shapes,
            lambda s: (
                {n: shape for group in s for n, shape in group.items()}
                if isinstance(s, (list, tuple)) and all(isinstance(g, Mapping) for g in s)
                else type(s).__name__
            ),
        ),
        AUTOEP_LAYERS: _summary(
            autoep,
            lambda a: (
                [
                    {k: e[k] for k in AUTOEP_FIELDS if k in e}
                    if isinstance(e, Mapping)
                    else type(e).__name__
                    for e in a
                ]
                if isinstance(a, list)
                else type(a).__name__
            ),
        ),
    }
    if isinstance(cfg, Mapping):
        flag = cfg.get(DATA_BEFORE_EXPERT, False)
        out["ds_config"] = {
            DATA_BEFORE_EXPERT: flag if isinstance(flag, bool) else type(flag).__name__
        }
    else:
        out["ds_config"] = type(cfg).__name__
    return out


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def degrees_from_metadata(
    files: Sequence[str], zero: Sequence[str], metadata: Sequence[tuple[str, Mapping[str, Any]]]
) -> ParallelDegrees:
    """The degrees a tag was saved at: from the degrees its writer recorded in every
    model-state file, else (older writers) from the file counts."""
    model_files = [f for f, _ in metadata]
    recorded, missing = [], []
    for f, meta in metadata:
        dims = meta.get(PARALLEL_DIMS)
        if dims is None:
            missing.append(f)
            continue
        if not isinstance(dims, Mapping):
            raise RuntimeError(f"Checkpoint {PARALLEL_DIMS} must be a dictionary in {f}.")
        for key in (PP_DEGREE, TP_DEGREE):
            if not _positive(dims.get(key)):
                raise RuntimeError(
                    f"Checkpoint {key} must be a positive integer in {f}, got {dims.get(key)!r}."
                )
        recorded.append((dims[PP_DEGREE], dims[TP_DEGREE]))
    if recorded:
        if missing:
            raise RuntimeError(
                f"Checkpoint {PARALLEL_DIMS} is missing from model-state files: {missing}"
            )
        if len(set(recorded)) != 1:
            raise RuntimeError(
                f"Checkpoint {PARALLEL_DIMS} disagrees across model-state files: {recorded}"
            )
        pp, tp = recorded[0]
        if len(model_files) != pp * tp:
            raise RuntimeError(
                f"Checkpoint model-state file count {len(model_files)} does not match "
                f"{PP_DEGREE}={pp} * {TP_DEGREE}={tp}."
            )
        if len(zero) % (pp * tp):
            raise RuntimeError(
                f"Checkpoint ZeRO file count {len(zero)} is not divisible by "
                f"{PP_DEGREE}={pp} * {TP_DEGREE}={tp}."
            )
        return ParallelDegrees(pp, tp, max(1, len(zero) // (pp * tp)))
    first_stage = files_with_prefix(files, "layer_01")
    if first_stage:
        tp = len(first_stage)
        pp = len(model_files) // tp
    else:
        tp, pp = max(1, len(model_files)), 1
    return ParallelDegrees(pp, tp, max(1, len(zero) // (pp * tp)))


def merge_state(a: Any, b: Any, path: Sequence[str] = ()) -> Any:
    """Two data-parallel partitions' states as one: tensors concatenated along dim 0,
    containers merged entry by entry, anything else taken from the first."""
    if type(a) is not type(b):
        raise ValueError(
            f"Cannot merge two states of types {type(a)} and {type(b)} at {'.'.join(path)}"
        )
    if isinstance(a, dict):
        return type(a)(
            {k: merge_state(a[k], v, [*path, str(k)]) if k in a else v for k, v in b.items()}
        )
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            raise ValueError(f"Cannot merge lists of different lengths, a = {len(a)} b = {len(b)}")
        return type(a)(merge_state(x, y, path) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return torch.cat([a, b], 0)
    return a


__all__ = [
    "RankMap2D",
    "all_files",
    "degrees_from_metadata",
    "files_with_prefix",
    "load_file",
    "merge_state",
    "model_state_metadata",
    "reshape_2d",
    "zero_files",
]
