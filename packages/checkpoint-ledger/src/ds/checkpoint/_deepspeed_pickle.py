"""Saving files that DeepSpeed unpickles into its own classes, without DeepSpeed installed.

DeepSpeed's optimizer partitions hold two of its objects that its tools read by attribute: the
ZeRO stage (an ``IntEnum``) and, per parameter, the fragment address (a dataclass with ``numel``
and ``start``) that the universal-checkpoint converter walks. ds writes stand-ins that
behave the same here and are pickled under DeepSpeed's class paths, so DeepSpeed loads its real
classes; ds's own reader (:func:`ds.checkpoint.deepspeed_layout.load_file`) loads them as inert
records as it does DeepSpeed's files.
"""

from __future__ import annotations

import pickle
import types
from dataclasses import dataclass
from typing import Any

import torch

_GLOBAL_ATTR = "_ds_pickled_as"


@dataclass
class FragmentAddress:
    """Where a parameter's elements lie in one rank's flat partition."""

    numel: int
    start: int


setattr(FragmentAddress, _GLOBAL_ATTR, ("deepspeed.utils.tensor_fragment", "fragment_address"))


class _ZeroStage:
    """Unpickles as ``ZeroStageEnum(value)`` in DeepSpeed."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return (_ZeroStageClass, (self.value,))


class _ZeroStageClass:  # only its pickled name matters: DeepSpeed's enum class
    pass


setattr(_ZeroStageClass, _GLOBAL_ATTR, ("deepspeed.runtime.zero.config", "ZeroStageEnum"))


def zero_stage(stage: int) -> Any:
    return _ZeroStage(stage)


class _Pickler(pickle._Pickler):  # the Python pickler: its save_global can be overridden
    def save_global(self, obj: Any, name: str | None = None) -> None:
        target = obj.__dict__.get(_GLOBAL_ATTR) if isinstance(obj, type) else None
        if target is None:
            super().save_global(obj, name)
            return
        module, qualname = target
        self.write(pickle.GLOBAL + f"{module}\n{qualname}\n".encode())
        self.memoize(obj)


_PICKLE_MODULE = types.ModuleType("ds_deepspeed_pickle")
_PICKLE_MODULE.Pickler = _Pickler  # type: ignore[attr-defined]


def save(obj: Any, path: str) -> None:
    """``torch.save`` with DeepSpeed's class paths for the stand-ins above."""
    torch.save(obj, path, pickle_module=_PICKLE_MODULE)
