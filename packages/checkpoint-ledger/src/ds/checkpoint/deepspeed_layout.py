"""What a DeepSpeed checkpoint tag holds and how its files are opened: the file-name patterns,
recognising a DeepSpeed (not ds) tag, refusing layouts ds does not load (model or pipeline
parallel files), and unpickling a file without running anything from it.

Every file is unpickled with ``torch.load(weights_only=True, mmap=True)``: DeepSpeed's own
bookkeeping classes (loss scalers, fragment addresses, enums) become inert records and nothing
from the file runs. :mod:`ds.checkpoint.deepspeed_format` maps the files onto ds's tensors and
re-exports these names.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from typing import Any

import torch

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
    if any(name.startswith("ds.checkpoint.universal_tp.") for name in unsafe):
        # the layout record ds's universal converter writes for a fused parameter
        from ds.checkpoint.universal_tp import SubparamShape

        aliases.append(SubparamShape)
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


def _rank_of(pattern: re.Pattern[str], name: str, group: int) -> int:
    m = pattern.match(name)
    return int(m.group(group)) if m else -1


__all__ = [
    "MODEL_STATES",
    "SUPPORTED",
    "InertRecord",
    "is_deepspeed_checkpoint",
    "load_file",
]
