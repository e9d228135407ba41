"""Writing DeepSpeed's universal checkpoint: every parameter's whole fp32 value and Adam moments
in ``zero/<name>/{fp32,exp_avg,exp_avg_sq,step}.pt``, independent of the data- and
tensor-parallel degrees it was trained at, so a run resumes at another layout.

Conversion runs in two passes over a temporary folder: each ZeRO partition's element range of
every parameter is written as ``<tmp>/<name>/<tp>/<state>.<dp>``; then the ranges are joined in
data-parallel order into each tensor rank's slice, and the slices merged by the layout the
writer recorded (:mod:`ds.checkpoint.universal_tp`).
"""

from __future__ import annotations

import glob
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from ds.checkpoint.deepspeed_layout import InertRecord, _attr, load_file
from ds.checkpoint.universal_tp import PARAM, all_patterns, merge_tp_param

STATES = ("fp32", "exp_avg", "exp_avg_sq")
OPTIM = "optimizer_state_dict"
PIPELINE_REPLICATED = "pipeline_replicated_parameter_patterns"
_DP = re.compile(r"\.([0-9]+)$")
_ZERO3_FILE = re.compile(r"(?:bf16_)?zero_pp_rank_([0-9]+)_mp_rank_([0-9]+)")


def _save(path: str, obj: Any) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(obj, path)


def plain(obj: Any) -> Any:
    """``obj`` with DeepSpeed's bookkeeping objects (read as inert records) turned into
    numbers (enums) or dicts, so that the written file loads without DeepSpeed."""
    if isinstance(obj, InertRecord):
        fields = {k: plain(v) for k, v in vars(obj).items() if k != "args"}
        # an enum is rebuilt from its value alone; an object from its attributes
        return int(obj) if getattr(obj, "args", ()) and not fields else fields
    if isinstance(obj, dict):
        return type(obj)((k, plain(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v) for v in obj)
    return obj


def dump_fragment(
    temp: str, tp: int, dp: int, state: str, flat: Any, name: str, offset: int, numel: int
) -> None:
    """One partition's element range of one state of ``name``."""
    if state != "step" and torch.is_tensor(flat):
        flat = flat.narrow(0, offset, numel).clone()
    _save(os.path.join(temp, name, str(tp), f"{state}.{dp:02d}"), flat)


def _flat_states(group_state: Mapping[str, Any], fp32: torch.Tensor) -> dict[str, Any]:
    out = {"exp_avg": group_state["exp_avg"], "exp_avg_sq": group_state["exp_avg_sq"], "fp32": fp32}
    if "step" in group_state:
        out["step"] = group_state["step"]
    return out


def extract_zero12(temp: str, layout: Any, pp: int, tp: int, dp: int) -> None:
    """The fragments one ZeRO-1/2 rank of a :class:`~ds.checkpoint.deepspeed_3d.CheckpointLayout`
    holds (parameters tied across pipeline stages are taken from the first stage only)."""
    sd = layout.get_zero_checkpoint_state(pp_index=pp, tp_index=tp, dp_index=dp)
    optim = sd[OPTIM]
    uc_info = layout.get_checkpoint_info("universal_checkpoint_info") or {}
    tied = uc_info.get(PIPELINE_REPLICATED, [])
    states = optim["base_optimizer_state"]["state"]
    fp32 = optim["single_partition_of_fp32_groups"]
    for gid in range(len(states)):
        flat = _flat_states(states[gid], fp32[gid])
        for name, frag in optim["param_slice_mappings"][gid].items():
            if pp > 0 and any(re.match(p, name) for p in tied):
                continue
            start, numel = int(_attr(frag, "start")), int(_attr(frag, "numel"))
            for key, value in flat.items():
                dump_fragment(temp, tp, dp, key, value, name, start, numel)


def _numel(shape: Any) -> int:
    return int(shape.numel()) if hasattr(shape, "numel") else math.prod(shape)


def extract_zero3(
    temp: str,
    optim_file: str,
    shapes: Sequence[Mapping[str, Any]],
    dp_degree: int,
    tp: int,
    dp: int,
    exclude: Iterable[str] = (),
) -> None:
    """The fragments of one ZeRO-3 optimizer file (rank ``dp`` of tensor rank ``tp``): each
    parameter owns ``ceil(numel / partitions)`` elements of every partition, padding last."""
    optim = load_file(optim_file)[OPTIM]
    groups = optim.get("ds_zero_partition_groups") or []
    skip = set(exclude)
    for gid, group_shapes in enumerate(shapes):
        flat = _flat_states(optim[OPTIM]["state"][gid], optim["fp32_flat_groups"][gid])
        meta = groups[gid] if gid < len(groups) else {}
        count = meta.get("partition_count", dp_degree)
        rank = meta.get("partition_rank", dp)
        offset = 0
        for name, shape in group_shapes.items():
            total = _numel(shape)
            per_rank = math.ceil(total / count)
            owned = max(0, min(per_rank, total - rank * per_rank))
            if name not in skip:
                for key, value in flat.items():
                    dump_fragment(temp, tp, dp, key, value, name, offset, owned)
            offset += per_rank


def merge_zero_shards(
    base: str, state: str, tp_degree: int, shapes: Sequence[Any] | None = None
) -> list[Any]:
    """Each tensor rank's slice of one state: its fragments joined in data-parallel order
    (and shaped, when the per-rank shapes are known). A rank that holds none of an uneven
    parameter gets an empty slice in its place, so later ranks keep their positions."""
    slices: list[Any] = []
    missing: list[tuple[int, int]] = []
    for tp in range(tp_degree):
        prefix = os.path.join(base, str(tp), state)
        paths = glob.glob(f"{glob.escape(prefix)}.*")
        if not paths:
            missing.append((tp, len(slices)))
            continue
        ranks = []
        for p in paths:
            m = _DP.search(p)
            if m is None:
                raise ValueError(f"Cannot parse dp_rank from {p}")
            ranks.append(int(m.group(1)))
        shards = [torch.load(f"{prefix}.{r:02d}", weights_only=False) for r in sorted(ranks)]
        if state == "step":
            if any(v != shards[0] for v in shards):
                raise AssertionError("All shards must have the same step value")
            slices.append(shards[0])
            continue
        whole = torch.cat(shards, dim=0)
        slices.append(whole if shapes is None else whole.reshape(tuple(shapes[tp])))
    if missing and shapes is not None and slices and torch.is_tensor(slices[0]):
        for tp, position in reversed(missing):
            if math.prod(shapes[tp]) != 0:
                raise AssertionError(
                    f"No fragment files for tp rank {tp} of a parameter whose recorded shape "
                    f"{tuple(shapes[tp])} is not empty."
                )
            slices.insert(position, torch.empty(tuple(shapes[tp]), dtype=slices[0].dtype))
    return slices


def merge_tp_slices(
    uc_info: Mapping[str, Any],
    out_dir: str,
    slice_dir: str,
    tp_degree: int,
    name_and_shapes: tuple[str, Sequence[Any]],
) -> set[str]:
    """Writes ``<out_dir>/<name>/<state>.pt`` for one parameter; answers the info's patterns
    that did not match it."""
    name, shapes = name_and_shapes
    base = os.path.join(slice_dir, name)
    used: set[str] = set()
    step = merge_zero_shards(base, "step", tp_degree, shapes)
    if step:
        _save(os.path.join(out_dir, name, "step.pt"), step[0])
    for state in STATES:
        entry = merge_tp_param(
            uc_info, name, merge_zero_shards(base, state, tp_degree, shapes), used
        )
        if entry is not None:
            _save(os.path.join(out_dir, name, f"{state}.pt"), entry)
    return all_patterns(uc_info) - used


def merge_zero3_slices(dp_degree: int, out_dir: str, slice_dir: str, name: str) -> None:
    """A parameter without tensor parallelism: its fragments joined, flat."""
    base = os.path.join(slice_dir, name)
    for state in STATES:
        _save(os.path.join(out_dir, name, f"{state}.pt"), merge_zero_shards(base, state, 1)[0])


def group_per_tp_shapes(
    shapes_by_file: Sequence[Mapping[str, Any]], pp_degree: int, tp_degree: int
) -> dict[str, list[Any]]:
    """Per parameter, its shape on each tensor rank, from the model-state files (pipeline-major:
    file ``pp * tp_degree + tp``); a parameter of one stage only is kept, a parameter tied across
    stages must have the same shape in each."""
    per_tp: list[dict[str, Any]] = []
    for tp in range(tp_degree):
        merged: dict[str, Any] = {}
        for pp in range(pp_degree):
            stage = shapes_by_file[pp * tp_degree + tp]
            for name in merged.keys() & stage.keys():
                if merged[name] != stage[name]:
                    raise AssertionError(
                        f"Pipeline replicas of {name} on tp rank {tp} disagree on shape: "
                        f"{merged[name]} vs {stage[name]}."
                    )
            merged.update(stage)
        per_tp.append(merged)
    names = set().union(*per_tp) if per_tp else set()
    return {n: [d.get(n) for d in per_tp] for n in names}


def zero3_rank_grid(files: Sequence[str]) -> tuple[list[list[str]], int, int]:
    """ZeRO-3 files as ``grid[tp][dp]`` (names ``zero_pp_rank_<dp>_mp_rank_<tp>``), refusing a
    grid with a hole."""
    grid: dict[int, dict[int, str]] = {}
    for path in files:
        m = _ZERO3_FILE.search(os.path.basename(path))
        if m is None:
            raise ValueError(f"Cannot parse ZeRO-3 tp/dp ranks from checkpoint file name: {path}")
        grid.setdefault(int(m.group(2)), {})[int(m.group(1))] = path
    tp_degree = max(grid) + 1
    dp_degree = max(max(d) for d in grid.values()) + 1
    for tp in range(tp_degree):
        for dp in range(dp_degree):
            if dp not in grid.get(tp, {}):
                raise RuntimeError(f"Missing ZeRO-3 checkpoint file for tp_rank={tp}, dp_rank={dp}")
    return [[grid[t][d] for d in range(dp_degree)] for t in range(tp_degree)], tp_degree, dp_degree


def save_optimizer_state_zero12(out: str, layout: Any) -> None:
    """``zero/optimizer_state.pt``: the optimizer's unsharded state and its param groups."""
    sd = layout.get_zero_checkpoint_state(pp_index=0, tp_index=0, dp_index=0)
    optim = sd[OPTIM]
    sharded = {"base_optimizer_state", "param_slice_mappings", "single_partition_of_fp32_groups"}
    result = {k: v for k, v in optim.items() if k not in sharded}
    result["param_groups"] = optim["base_optimizer_state"]["param_groups"]
    _save(os.path.join(out, "zero", "optimizer_state.pt"), plain(result))


def save_optimizer_state_zero3(out: str, optim_file: str) -> None:
    optim = dict(load_file(optim_file)[OPTIM])
    optim["param_groups"] = optim[OPTIM]["param_groups"]
    _save(os.path.join(out, "zero", "optimizer_state.pt"), plain(optim))


def write_missing_fp32(out: str, model_files: Sequence[str]) -> None:
    """The model's value as ``fp32.pt`` for parameters ZeRO holds no optimizer state of (they
    never received a gradient), so that a resume still restores them."""
    for f in model_files:
        module = load_file(f).get("module")
        if module is None:  # pipeline checkpoints keep weights in layer files
            continue
        for name, tensor in module.items():
            path = os.path.join(out, "zero", name, "fp32.pt")
            if not os.path.isfile(path):
                _save(path, {PARAM: tensor.float()})


__all__ = [
    "dump_fragment",
    "extract_zero12",
    "extract_zero3",
    "group_per_tp_shapes",
    "merge_tp_slices",
    "merge_zero3_slices",
    "merge_zero_shards",
    "plain",
    "save_optimizer_state_zero12",
    "save_optimizer_state_zero3",
    "write_missing_fp32",
    "zero3_rank_grid",
]
