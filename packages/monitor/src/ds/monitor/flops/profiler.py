"""The flops profiler: parameters, MACs, FLOPs and latency per module of one forward pass.

Module hooks keep a stack of the modules being run; a dispatch mode, active only while the root
module's forward runs, charges each aten op's MACs (see :mod:`rules`) to every module on the stack,
so a parent's count includes its children's. Backward FLOPs are given by rule (twice the forward:
one product for the input gradient, one for the weight gradient), plus ``recompute_fwd_factor``
forwards when activation checkpointing recomputes them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ds.monitor.flops.rules import macs_of


@dataclass
class ModuleStats:
    name: str
    type_name: str
    depth: int
    params: int
    macs: int = 0
    calls: int = 0
    latency_s: float = 0.0
    children: list[str] = field(default_factory=list)

    @property
    def flops(self) -> int:
        return 2 * self.macs


class _Counter(TorchDispatchMode):
    def __init__(self, profiler: FlopsProfiler) -> None:
        super().__init__()
        self.profiler = profiler

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        macs = macs_of(func, args, kwargs)
        if macs:
            for name in self.profiler._stack:
                self.profiler.stats[name].macs += macs
        return out


def _sync(model: torch.nn.Module) -> None:
    p = next(model.parameters(), None)
    if p is not None and p.device.type == "cuda":
        torch.cuda.synchronize(p.device)


class FlopsProfiler:
    """Profiles the forward passes of ``model`` between :meth:`start_profile` and
    :meth:`stop_profile` (DeepSpeed's method names)."""

    def __init__(self, model: torch.nn.Module, recompute_fwd_factor: float = 0.0) -> None:
        self.model = model
        self.recompute_fwd_factor = float(recompute_fwd_factor)
        self.stats: dict[str, ModuleStats] = {}
        self._stack: list[str] = []
        self._starts: list[float] = []
        self._handles: list[Any] = []
        self._mode: _Counter | None = None
        self.started = False
        self.forward_passes = 0
        # The totals of the last window profiled (DeepSpeed's attributes), set by stop_profile.
        self.flops: int | None = None
        self.macs: int | None = None
        self.params: int | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start_profile(self, ignore_list: tuple[type, ...] | list[type] | None = None) -> None:
        self.reset_profile()
        ignore = tuple(ignore_list or ())
        for name, module in self.model.named_modules():
            if ignore and isinstance(module, ignore):
                continue
            depth = 0 if name == "" else name.count(".") + 1
            self.stats[name] = ModuleStats(
                name=name,
                type_name=type(module).__name__,
                depth=depth,
                params=sum(p.numel() for p in module.parameters()),
            )
            if name:
                parent = name.rsplit(".", 1)[0] if "." in name else ""
                if parent in self.stats:
                    self.stats[parent].children.append(name)
            self._handles.append(module.register_forward_pre_hook(self._pre(name)))
            self._handles.append(module.register_forward_hook(self._post(name), always_call=True))
        self.started = True

    def stop_profile(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        if self.started and "" in self.stats:
            root = self.stats[""]
            self.flops, self.macs, self.params = root.flops, root.macs, root.params
        self.started = False

    def reset_profile(self) -> None:
        for s in self.stats.values():
            s.macs, s.calls, s.latency_s = 0, 0, 0.0
        self.forward_passes = 0

    def end_profile(self) -> None:
        self.stop_profile()
        self.stats.clear()

    def _pre(self, name: str):  # type: ignore[no-untyped-def]
        def hook(module: torch.nn.Module, inputs: Any) -> None:
            if not self._stack:
                _sync(self.model)
                self._mode = _Counter(self)
                self._mode.__enter__()
            self._stack.append(name)
            self._starts.append(time.perf_counter())

        return hook

    def _post(self, name: str):  # type: ignore[no-untyped-def]
        def hook(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            if not self._stack or self._stack[-1] != name:
                return
            if len(self._stack) == 1:
                _sync(self.model)
            s = self.stats[name]
            s.latency_s += time.perf_counter() - self._starts.pop()
            s.calls += 1
            self._stack.pop()
            if not self._stack and self._mode is not None:
                self._mode.__exit__(None, None, None)
                self._mode = None
                self.forward_passes += 1

        return hook

    # -- totals (DeepSpeed's getters) ------------------------------------------------------
    @property
    def root(self) -> ModuleStats:
        return self.stats[""]

    def get_total_macs(self, as_string: bool = False) -> int | str:
        return number_to_string(self.root.macs, "MACs") if as_string else self.root.macs

    def get_total_flops(self, as_string: bool = False) -> int | str:
        return number_to_string(self.root.flops, "FLOPs") if as_string else self.root.flops

    def get_total_duration(self, as_string: bool = False) -> float | str:
        d = self.root.latency_s
        return f"{d * 1e3:.2f} ms" if as_string else d

    def get_total_params(self, as_string: bool = False) -> int | str:
        return number_to_string(self.root.params, "") if as_string else self.root.params

    def training_flops(self) -> float:
        """Forward + backward (by rule) + recomputed forwards, for the passes profiled."""
        return self.root.flops * (3.0 + self.recompute_fwd_factor)

    def top_modules(self, depth: int, k: int) -> list[ModuleStats]:
        at = [s for s in self.stats.values() if s.depth == depth]
        return sorted(at, key=lambda s: s.macs, reverse=True)[:k]


def number_to_string(n: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {prefix}{unit}".rstrip()
    return f"{n:g} {unit}".rstrip()
