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
from the file runs; memory-mapping means only the bytes a rank asks for are read.
"""

from __future__ import annotations

import functools
import glob
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ds.interfaces.checkpoint import LoadRequest, ShardedStateDict, ShardedTensor, TensorMeta
from ds.interfaces.errors import CheckpointError

MODEL_STATES = "mp_rank_00_model_states.pt"
_ZERO_MODEL = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
_OPTIM = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_MP = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
_LAYER = re.compile(r"^layer_\d+-model_\d+-model_states\.pt$")
SUPPORTED = (
    "ds loads DeepSpeed data-parallel checkpoints (ZeRO stages 0-3, fp32/bf16/fp16, one "
    "mp_rank_00, no pipeline layer files) and universal checkpoints"
)
# Keys of DeepSpeed's model-states dict that are its own; anything else is the client state.
_ENGINE_KEYS = frozenset(
    {
        "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
        "shared_params", "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd",
        "sparse_tensor_module_names", "skipped_steps", "global_steps", "global_samples",
        "dp_world_size", "mp_world_size", "ds_config", "ds_version", "universal_checkpoint_info",
        "ds_deepcompile_info", "compiled_autograd", "zenflow", "ds_world_size",
        "checkpoint_parallel_dimensions",
    }
)  # fmt: skip
_GROUP_KEYS = ("lr", "betas", "eps", "weight_decay", "momentum", "dampening", "nesterov")


# -- unpickling without running anything ----------------------------------------------------------
class InertRecord:
    """What a DeepSpeed object (loss scaler, fragment address, ...) becomes when loaded: its
    constructor arguments and attributes, nothing else."""

    ds_qualname = "deepspeed.?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.__dict__.update(kwargs)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict):
            self.__dict__.update(state)
        elif isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            self.__dict__.update(state[1])  # (dict, slots) from classes with __slots__
        else:
            self.state = state

    def __int__(self) -> int:  # enums (ZeroStageEnum) are pickled as EnumClass(value)
        return int(self.args[0]) if self.args else 0

    def __repr__(self) -> str:
        return f"<inert {self.ds_qualname} {self.__dict__}>"


@functools.cache
def _standin(qualname: str) -> type:
    return type(qualname.rpartition(".")[2], (InertRecord,), {"ds_qualname": qualname})


def load_file(path: str) -> Any:
    """One DeepSpeed checkpoint file, weights-only; DeepSpeed's classes load as inert records."""
    from ds.checkpoint.safe_load import safe_torch_load

    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path} is missing; the DeepSpeed checkpoint is incomplete") from exc
    except Exception as exc:
        raise CheckpointError(
            f"{path} is not a readable torch file ({type(exc).__name__}: {exc}); the "
            "checkpoint is damaged"
        ) from exc
    aliases: list[Any] = [
        (_standin(name), name) for name in unsafe if name.startswith(("deepspeed.", "__main__."))
    ]
    return safe_torch_load(path, extra_globals=aliases, mmap=True)


def _attr(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


# -- recognising a DeepSpeed checkpoint -----------------------------------------------------------
def _tag_dir(directory: str, tag: str | None) -> str | None:
    """The tag's folder (``tag``, else the one ``latest`` names), or None when there is none;
    a tag that leaves ``directory`` is refused as ds's own format refuses it."""
    from ds.checkpoint._format import check_tag, read_latest

    tag = read_latest(directory) if tag is None else check_tag(tag)
    if tag is None:
        return None
    path = os.path.join(directory, tag)
    return path if os.path.isdir(path) else None


def is_deepspeed_checkpoint(directory: str, tag: str | None = None) -> bool:
    """True for a DeepSpeed (not ds) checkpoint tag directory."""
    path = _tag_dir(directory, tag)
    if path is None or os.path.exists(os.path.join(path, "manifest.json")):
        return False
    names = os.listdir(path)
    return any(_MP.match(n) or _ZERO_MODEL.match(n) or _LAYER.match(n) for n in names) or (
        os.path.isdir(os.path.join(path, "zero"))
    )


def _check_layout(path: str, names: list[str]) -> None:
    found: list[str] = []
    mp = {int(m.group(1)) for n in names if (m := _MP.match(n))}
    mp |= {int(m.group(2)) for n in names if (m := _ZERO_MODEL.match(n))}
    mp |= {int(m.group(3)) for n in names if (m := _OPTIM.match(n))}
    if mp - {0}:
        found.append(f"tensor/model-parallel degree {max(mp) + 1} (mp_rank_00..{max(mp):02d})")
    layers = [n for n in names if _LAYER.match(n)]
    if layers:
        found.append(f"pipeline parallelism ({len(layers)} layer_*-model_states.pt files)")
    if found:
        raise CheckpointError(
            f"DeepSpeed checkpoint {path} was saved with {' and '.join(found)}; {SUPPORTED}. "
            "Nothing was loaded"
        )


# -- the logical tensors --------------------------------------------------------------------------
@dataclass(frozen=True)
class _Piece:
    """Elements [start, start + numel) of a logical tensor are ``flat[local : local + numel]``."""

    start: int
    numel: int
    source: Callable[[], torch.Tensor]  # the flat 1-D tensor (loaded lazily, memory-mapped)
    local: int


@dataclass
class _Logical:
    meta: TensorMeta
    pieces: list[_Piece]

    def read(self, offset: int, numel: int) -> torch.Tensor:
        out = torch.empty(numel, dtype=getattr(torch, self.meta.dtype))
        stop, filled = offset + numel, 0
        for p in self.pieces:
            lo, hi = max(offset, p.start), min(stop, p.start + p.numel)
            if lo >= hi:
                continue
            flat = p.source().reshape(-1)
            out[lo - offset : hi - offset].copy_(
                flat[p.local + lo - p.start : p.local + hi - p.start]
            )
            filled += hi - lo
        if filled != numel:
            raise CheckpointError(
                f"the DeepSpeed checkpoint holds only {filled} of elements [{offset}, {stop}) of "
                f"{self.meta.name!r}; the checkpoint is incomplete"
            )
        return out


def _rank_of(pattern: re.Pattern[str], name: str, group: int) -> int:
    m = pattern.match(name)
    return int(m.group(group)) if m else -1


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _numel(shape: Any) -> int:
    return int(math.prod(int(s) for s in shape))


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
        ms = self.model_states
        steps = int(ms.get("global_steps") or 0)
        cfg = self.ds_config
        gas = cfg.get("gradient_accumulation_steps")
        if not isinstance(gas, int):
            tbs, mbs = cfg.get("train_batch_size"), cfg.get("train_micro_batch_size_per_gpu")
            gas = (
                tbs // (mbs * self.world_size)
                if isinstance(tbs, int) and isinstance(mbs, int)
                else 1
            )
        groups = getattr(self, "_groups", [])
        steps_per_group = getattr(self, "_steps", [])
        scalar_state = []
        for i in range(max(len(groups), 1)):
            s = steps_per_group[i] if i < len(steps_per_group) else None
            s = steps if s is None else s
            scalar_state.append({"step": int(float(s))})
        objects: dict[str, Any] = {
            "step": steps,
            "global_steps": steps,
            "global_samples": int(ms.get("global_samples") or 0),
            "micro_steps": steps * max(int(gas or 1), 1),
            "skipped_steps": int(ms.get("skipped_steps") or 0),
            "lr_scheduler": ms.get("lr_scheduler"),
            "client_state": {k: v for k, v in ms.items() if k not in _ENGINE_KEYS},
            "world_size": self.world_size,
            "zero_stage": self.stage,
            "ds_config": cfg,
            "optimizer.param_groups": [
                {k: (tuple(v) if k == "betas" else v) for k, v in g.items() if k in _GROUP_KEYS}
                for g in groups
            ],
            "optimizer.scalar_state": scalar_state,
            "stage3.step_count": int(scalar_state[0]["step"]) if scalar_state else steps,
            "saved_by": f"DeepSpeed {ms.get('ds_version', '?')}",
        }
        scaler = self._loss_scaler()
        if scaler is not None:
            objects["loss_scaler"] = scaler
        self.objects = objects

    def _loss_scaler(self) -> dict[str, Any] | None:
        if self.optim_files:
            ls = self._optim(0).get("loss_scaler")
        else:  # stage 0: DeepSpeed's FP16 optimizers keep the scale in their own state dict
            ls = self.model_states.get("optimizer")
            ls = ls if _attr(ls, "cur_scale") is not None else None
        if ls is None:
            return None
        out: dict[str, Any] = {"cur_scale": float(_attr(ls, "cur_scale", 1.0))}
        for src, dst in (("cur_hysteresis", "cur_hysteresis"), ("cur_iter", "cur_iter"),
                         ("last_overflow_iter", "last_overflow_iter")):  # fmt: skip
            v = _attr(ls, src)
            if v is not None:
                out[dst] = int(v)
        return out

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
