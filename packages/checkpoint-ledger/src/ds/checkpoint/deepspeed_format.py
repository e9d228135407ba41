"""Reading checkpoints saved by DeepSpeed, as the logical tensors ds's engines load.

A DeepSpeed checkpoint tag directory holds ``mp_rank_00_model_states.pt`` (stages 0-2) or
``zero_pp_rank_<r>_mp_rank_00_model_states.pt`` (stage 3), the optimizer partitions
``[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt`` (one per data-parallel rank, stages 1-3 and
bf16), or, for a universal checkpoint, ``zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt``. This module
maps them onto ds's names: ``module.<p>`` (weights in the model dtype), ``master.<p>`` (fp32
master weights), ``optim.<state>.<p>`` (Adam moments), ``buffer.<b>``, plus the engine's objects
(step counters, LR scheduler, loss scaler, optimizer groups, client state). Each parameter is
read as the flat element range a ds rank asks for, from whichever DeepSpeed partitions hold it,
so a checkpoint saved at one world size loads at any other and into any ZeRO stage.

Every file is unpickled with ``torch.load(weights_only=True, mmap=True)``: DeepSpeed's own
bookkeeping classes (loss scalers, fragment addresses, enums) become inert records and nothing
from the file runs; memory-mapping means only the bytes a rank asks for are read. Which files a
tag holds, recognising one and opening a file safely: :mod:`ds.checkpoint.deepspeed_layout`
(its public names are re-exported here).
"""

from __future__ import annotations

import functools
import glob
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from ds.checkpoint._deepspeed_objects import engine_objects
from ds.checkpoint._deepspeed_tensors import _dtype_name, _Logical, _numel, _Piece, _same
from ds.checkpoint.deepspeed_layout import (
    _OPTIM,
    _ZERO_MODEL,
    MODEL_STATES,
    SUPPORTED,
    InertRecord,
    _attr,
    _check_layout,
    _rank_of,
    _tag_dir,
    is_deepspeed_checkpoint,
    load_file,
)
from ds.interfaces.checkpoint import LoadRequest, ShardedStateDict, ShardedTensor, TensorMeta
from ds.interfaces.errors import CheckpointError


class DeepSpeedCheckpoint:
    """One tag of a DeepSpeed checkpoint, opened for ds (files load on first use)."""

    def __init__(self, directory: str, tag: str | None = None) -> None:
        path = _tag_dir(directory, tag)
        if path is None:
            raise CheckpointError(f"no DeepSpeed checkpoint tag {tag!r} in {directory}")
        self.path = path
        self.tag = os.path.basename(path)
        names = sorted(os.listdir(path))
        _check_layout(path, names)
        self._cache: dict[str, Any] = {}
        self.universal = os.path.isdir(os.path.join(path, "zero")) and not any(
            _OPTIM.match(n) for n in names
        )
        model_files = [n for n in names if _ZERO_MODEL.match(n)]
        self.optim_files = sorted(
            (n for n in names if _OPTIM.match(n)),
            key=lambda n: _rank_of(_OPTIM, n, 2),
        )
        if MODEL_STATES in names:
            self.model_file = MODEL_STATES
        elif model_files:
            self.model_file = min(model_files, key=lambda n: _rank_of(_ZERO_MODEL, n, 1))
        else:
            raise CheckpointError(
                f"{path} has no mp_rank_00_model_states.pt nor zero_pp_rank_0_mp_rank_00_model_"
                "states.pt; it is not a complete DeepSpeed checkpoint"
            )
        self.model_states: dict[str, Any] = dict(self._load(self.model_file))
        cfg = self.model_states.get("ds_config") or {}
        self.ds_config: dict[str, Any] = dict(cfg) if isinstance(cfg, Mapping) else {}
        self.stage = int(_attr(self.ds_config.get("zero_optimization") or {}, "stage", 0) or 0)
        self.world_size = int(self.model_states.get("dp_world_size") or len(self.optim_files) or 1)
        self.tensors: dict[str, _Logical] = {}
        self.objects: dict[str, Any] = {}
        self._build()

    # -- files --
    def _load(self, name: str) -> Any:
        if name not in self._cache:
            self._cache[name] = load_file(os.path.join(self.path, name))
        return self._cache[name]

    def _optim(self, rank: int) -> dict[str, Any]:
        sd = self._load(self.optim_files[rank])
        return dict(sd.get("optimizer_state_dict") or {})

    # -- mapping --
    def _param_shapes(self) -> list[dict[str, Any]]:
        shapes = self.model_states.get("param_shapes")
        if shapes is None:
            return []
        if isinstance(shapes, Mapping):
            shapes = [shapes]
        return [dict(g) for g in shapes]

    def _add(self, name: str, shape: Any, dtype: torch.dtype, pieces: list[_Piece]) -> None:
        self.tensors[name] = _Logical(
            TensorMeta(name, tuple(int(s) for s in shape), _dtype_name(dtype)), pieces
        )

    def _whole(self, name: str, t: torch.Tensor) -> None:
        self._add(name, t.shape, t.dtype, [_Piece(0, t.numel(), functools.partial(_same, t), 0)])

    def _build(self) -> None:
        module = self.model_states.get("module") or {}
        buffers = set(self.model_states.get("buffer_names") or ())
        shapes = self._param_shapes()
        param_names = [n for g in shapes for n in g]
        frozen = dict(self.model_states.get("frozen_param_shapes") or {})
        model_dtype = torch.float32
        for n in param_names:
            t = module.get(n)
            if isinstance(t, torch.Tensor) and t.numel():
                model_dtype = t.dtype
                break
        if (
            self.ds_config.get("bf16", {}).get("enabled")
            if isinstance(self.ds_config.get("bf16"), Mapping)
            else False
        ):
            model_dtype = torch.bfloat16
        elif isinstance(self.ds_config.get("fp16"), Mapping) and self.ds_config["fp16"].get(
            "enabled"
        ):
            model_dtype = torch.float16
        self.model_dtype = model_dtype
        for n in buffers:
            t = module.get(n)
            if isinstance(t, torch.Tensor):
                self._whole(f"buffer.{n}", t)
        self._build_frozen(frozen, module)
        if self.universal:
            self._build_universal(param_names, shapes, module)
        elif self.optim_files:
            self._build_zero(shapes)
            if self.stage < 3:  # model-dtype weights are whole in the module state
                for n in param_names:
                    t = module.get(n)
                    if isinstance(t, torch.Tensor) and t.numel():
                        self._whole(f"module.{n}", t)
        else:
            self._build_stage0(module)
        for n in [k for k in self.tensors if k.startswith("master.")]:
            module_name = "module." + n[len("master.") :]
            if module_name not in self.tensors:  # stage 3 saves no whole weights: read the masters
                master = self.tensors[n]
                meta = TensorMeta(module_name, master.meta.shape, master.meta.dtype)
                self.tensors[module_name] = _Logical(meta, master.pieces)
            if model_dtype == torch.float32:
                del self.tensors[n]  # in fp32 the masters are the weights
        self._build_objects()

    def _build_frozen(self, shapes: Mapping[str, Any], module: Mapping[str, Any]) -> None:
        """Frozen (requires_grad=False) parameters: whole in the module state at stages 0-2; at
        stage 3 each rank's model-states file holds its ceil(numel / world) fragment."""
        if self.stage < 3:
            fragments = self.model_states.get("frozen_param_fragments") or {}
            for n, shape in shapes.items():
                t = (
                    fragments.get(n)
                    if isinstance(fragments.get(n), torch.Tensor)
                    else module.get(n)
                )
                if isinstance(t, torch.Tensor) and t.numel() == _numel(shape):
                    self._whole(f"frozen.{n}", t.reshape(tuple(shape)))
            return
        files = sorted(
            (n for n in os.listdir(self.path) if _ZERO_MODEL.match(n)),
            key=lambda n: _rank_of(_ZERO_MODEL, n, 1),
        )
        world = len(files)

        def fragment(r: int, name: str) -> torch.Tensor:
            t = (self._load(files[r]).get("frozen_param_fragments") or {})[name]
            assert isinstance(t, torch.Tensor)
            return t

        for n, shape in shapes.items():
            numel = _numel(shape)
            per_rank = math.ceil(numel / max(world, 1))
            pieces = [
                _Piece(r * per_rank, min(per_rank, numel - r * per_rank),
                       functools.partial(fragment, r, n), 0)
                for r in range(world)
                if r * per_rank < numel
            ]  # fmt: skip
            dtype = fragment(0, n).dtype
            self._add(f"frozen.{n}", shape, dtype, pieces)

    def _build_stage0(self, module: Mapping[str, Any]) -> None:
        """Stage 0 (no partitioned optimizer): whole weights in ``module``; ``optimizer`` is a
        torch optimizer state dict (fp32) or, with bf16/fp16, DeepSpeed's wrapper holding the
        fp32 masters (``fp32_groups``) beside the torch state (``optimizer_state_dict``)."""
        names = [
            n
            for n, t in module.items()
            if isinstance(t, torch.Tensor)
            and f"buffer.{n}" not in self.tensors
            and f"frozen.{n}" not in self.tensors
        ]
        for n in names:
            self._whole(f"module.{n}", module[n])
        opt = self.model_states.get("optimizer") or {}
        inner = _attr(opt, "optimizer_state_dict")
        torch_sd = inner if inner is not None else opt
        state = _attr(torch_sd, "state", {}) or {}
        groups = _attr(torch_sd, "param_groups", []) or []
        index = [i for g in groups for i in g.get("params", [])]
        by_index = dict(zip(index, names, strict=False))  # params are numbered in module order
        for i, n in by_index.items():
            for key, t in (state.get(i) or {}).items():
                if isinstance(t, torch.Tensor) and t.dim() > 0:
                    self._whole(f"optim.{key}.{n}", t)
        masters = _attr(opt, "fp32_groups") or _attr(opt, "fp32_groups_flat")
        if masters is not None:
            flat_list = [t for g in masters for t in (g if isinstance(g, (list, tuple)) else [g])]
            for t, n in zip(flat_list, names, strict=False):
                if isinstance(t, torch.Tensor):
                    self._whole(f"master.{n}", t.float().reshape(module[n].shape))
        self._groups = [dict(g) for g in groups]
        self._steps = []
        for g in groups:
            found = [s["step"] for i in g.get("params", []) if (s := state.get(i)) and "step" in s]
            self._steps.append(found[0] if found else None)

    def _build_zero(self, shapes: list[dict[str, Any]]) -> None:
        world = len(self.optim_files)
        first = self._optim(0)
        base = first.get("base_optimizer_state") or first.get("optimizer_state_dict") or {}
        self._groups = [dict(g) for g in (_attr(base, "param_groups", []) or [])]
        if self.stage == 3:
            self._build_stage3(shapes, world)
        else:
            self._build_flat_partitions(shapes, world)

    def _build_flat_partitions(self, shapes: list[dict[str, Any]], world: int) -> None:
        """Stages 1-2 and bf16: each group's params lie contiguously in one flat vector, cut into
        ``world`` equal partitions (padding at the end)."""
        steps: list[Any] = []
        for gi, group in enumerate(shapes):

            def part(r: int, key: str, gi: int = gi) -> torch.Tensor:
                sd = self._optim(r)
                if key == "fp32":
                    t = sd["single_partition_of_fp32_groups"][gi]
                else:
                    base = sd.get("base_optimizer_state") or {}
                    t = _attr(base, "state", {})[gi][key]
                assert isinstance(t, torch.Tensor)
                return t

            part_numel = int(self._optim(0)["single_partition_of_fp32_groups"][gi].numel())
            base0 = self._optim(0).get("base_optimizer_state") or {}
            st0 = (_attr(base0, "state", {}) or {}).get(gi) or {}
            steps.append(st0.get("step"))
            keys = ["fp32"] + [
                k for k, v in st0.items() if isinstance(v, torch.Tensor) and v.dim() > 0
            ]
            offset = 0
            for n, shape in group.items():
                numel = _numel(shape)
                for key in keys:
                    pieces = []
                    for r in range(world):
                        lo, hi = (
                            max(offset, r * part_numel),
                            min(offset + numel, (r + 1) * part_numel),
                        )
                        if lo < hi:
                            pieces.append(
                                _Piece(
                                    lo - offset,
                                    hi - lo,
                                    functools.partial(part, r, key),
                                    lo - r * part_numel,
                                )
                            )
                    name = f"master.{n}" if key == "fp32" else f"optim.{key}.{n}"
                    self._add(name, shape, torch.float32, pieces)
                offset += numel
        self._steps = steps

    def _build_stage3(self, shapes: list[dict[str, Any]], world: int) -> None:
        """Stage 3: every parameter is cut into ``world`` pieces of ceil(numel / world) elements;
        rank r's flat vector holds its piece of every parameter, in order."""

        def flat(r: int, key: str) -> torch.Tensor:
            sd = self._optim(r)
            if key == "fp32":
                groups = sd["fp32_flat_groups"]
            else:
                base = sd.get("optimizer_state_dict") or sd.get("base_optimizer_state") or {}
                state = _attr(base, "state", {}) or {}
                groups = [state[i][key] for i in sorted(state)]
            return (
                torch.cat([g.reshape(-1) for g in groups])
                if len(groups) > 1
                else groups[0].reshape(-1)
            )

        cached: dict[tuple[int, str], torch.Tensor] = {}

        def source(r: int, key: str) -> torch.Tensor:
            if (r, key) not in cached:
                cached[(r, key)] = flat(r, key)
            return cached[(r, key)]

        sd0 = self._optim(0)
        base0 = sd0.get("optimizer_state_dict") or sd0.get("base_optimizer_state") or {}
        st = _attr(base0, "state", {}) or {}
        first = st[sorted(st)[0]] if st else {}
        keys = ["fp32"] + [
            k for k, v in first.items() if isinstance(v, torch.Tensor) and v.dim() > 0
        ]
        self._steps = [first.get("step")] * max(1, len(self._groups))
        offset = 0
        for n, shape in ((n, s) for g in shapes for n, s in g.items()):
            numel = _numel(shape)
            per_rank = math.ceil(numel / world)
            for key in keys:
                pieces = []
                for r in range(world):
                    lo, hi = r * per_rank, min(numel, (r + 1) * per_rank)
                    if lo < hi:
                        pieces.append(
                            _Piece(lo, hi - lo, functools.partial(source, r, key), offset)
                        )
                name = f"master.{n}" if key == "fp32" else f"optim.{key}.{n}"
                self._add(name, shape, torch.float32, pieces)
            offset += per_rank

    def _build_universal(
        self, names: list[str], shapes: list[dict[str, Any]], module: Mapping[str, Any]
    ) -> None:
        zero = os.path.join(self.path, "zero")
        # a ZeRO-3 conversion stores each state flat: the recorded shape is the parameter's
        recorded = {n: tuple(int(d) for d in shape) for g in shapes for n, shape in g.items()}
        if not names:
            names = sorted(d for d in os.listdir(zero) if os.path.isdir(os.path.join(zero, d)))
        for n in names:
            folder = os.path.join(zero, n)
            if not os.path.isdir(folder):
                raise CheckpointError(f"universal checkpoint {self.path} has no zero/{n}/ folder")
            for fname in sorted(os.listdir(folder)):
                key = fname.removesuffix(".pt")
                rel = os.path.join("zero", n, fname)
                sd = self._load(rel)
                t = sd.get("param") if isinstance(sd, Mapping) else sd
                if not isinstance(t, torch.Tensor):
                    continue
                shape = recorded.get(n)
                if t.dim() == 1 and shape is not None and t.numel() == _numel(shape):
                    t = t.view(shape)
                if key == "fp32":
                    self._whole(f"master.{n}", t.float())
                elif key == "step":
                    self._steps = [t]
                elif t.dim() > 0:
                    self._whole(f"optim.{key}.{n}", t.float())
        opt_path = os.path.join("zero", "optimizer_state.pt")
        opt = self._load(opt_path) if os.path.exists(os.path.join(self.path, opt_path)) else {}
        self._groups = [dict(g) for g in (_attr(opt, "param_groups", []) or [])]
        if not hasattr(self, "_steps"):
            self._steps = [None]

    def _build_objects(self) -> None:
        self.objects = engine_objects(self)

    # -- what the checkpoint engine serves --
    def metadata(self) -> dict[str, TensorMeta]:
        return {n: t.meta for n, t in self.tensors.items()}

    def load(self, requests: Sequence[LoadRequest]) -> ShardedStateDict:
        out = ShardedStateDict()
        for req in requests:
            t = self.tensors.get(req.name)
            if t is None:
                known = ", ".join(sorted(self.tensors)[:8])
                raise CheckpointError(
                    f"tensor {req.name!r} is not in DeepSpeed checkpoint {self.path} (it holds "
                    f"{len(self.tensors)} tensors, e.g. {known}); was it saved from another model?"
                )
            if req.offset < 0 or req.offset + req.numel > t.meta.numel:
                raise CheckpointError(
                    f"request for {req.name!r} elements [{req.offset}, {req.offset + req.numel}) "
                    f"is outside its {t.meta.numel} elements"
                )
            out.tensors[req.name] = ShardedTensor(t.meta, req.offset, t.read(req.offset, req.numel))
        out.objects = dict(self.objects)
        out.rank_objects = {}  # DeepSpeed saves no per-rank RNG state
        return out

    def consolidated(self, *, exclude_frozen: bool = False) -> Iterable[tuple[str, torch.Tensor]]:
        """(name, whole fp32 tensor) per parameter, one at a time (then frozen ones, buffers)."""
        for n, t in self.tensors.items():
            if n.startswith("module."):
                master = self.tensors.get(f"master.{n[7:]}", t)
                yield n[7:], master.read(0, master.meta.numel).float().reshape(master.meta.shape)
        if not exclude_frozen:
            for n, t in self.tensors.items():
                if n.startswith("frozen."):
                    yield n[7:], t.read(0, t.meta.numel).reshape(t.meta.shape)
        for n, t in self.tensors.items():
            if n.startswith("buffer."):
                yield n[7:], t.read(0, t.meta.numel).reshape(t.meta.shape)


@functools.lru_cache(maxsize=4)
def _open_cached(path: str, tag: str | None, mtime: float) -> DeepSpeedCheckpoint:
    return DeepSpeedCheckpoint(path, tag)


def open_checkpoint(directory: str, tag: str | None = None) -> DeepSpeedCheckpoint:
    """The DeepSpeed checkpoint ``tag`` (default: the one ``latest`` names) of ``directory``.
    A small cache keeps one load's metadata and reads on the same opened files."""
    path = _tag_dir(directory, tag)
    mtime = os.path.getmtime(path) if path else 0.0
    return _open_cached(os.path.abspath(directory), tag, mtime)


def consolidated_fp32_state_dict(
    directory: str, tag: str | None = None, *, exclude_frozen_parameters: bool = False
) -> dict[str, torch.Tensor]:
    ck = DeepSpeedCheckpoint(directory, tag)
    return dict(ck.consolidated(exclude_frozen=exclude_frozen_parameters))


def list_tags(directory: str) -> list[str]:
    return sorted(
        os.path.basename(p) for p in glob.glob(os.path.join(directory, "*")) if os.path.isdir(p)
    )


__all__ = [
    "MODEL_STATES",
    "SUPPORTED",
    "DeepSpeedCheckpoint",
    "InertRecord",
    "consolidated_fp32_state_dict",
    "is_deepspeed_checkpoint",
    "list_tags",
    "load_file",
    "open_checkpoint",
]
