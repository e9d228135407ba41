"""``deepspeed.accelerator.abstract_accelerator.DeepSpeedAccelerator``: DeepSpeed's accelerator
methods over a ds accelerator (``ds.accelerators`` registry).

ds's accelerators carry the device services (devices, streams, events, RNG, memory, dtypes,
pinned memory); this class adds DeepSpeed's spellings of them (``Stream``, ``Event``,
``range_push``, ``memory_cached``, ``FloatTensor``, ``create_op_builder``, ...). Anything else is
looked up on the ds accelerator itself."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ds.full.compat.deepspeed.accelerator.pinning import Pinning


def _typed_tensor(dtype: torch.dtype) -> property:
    """DeepSpeed's ``accelerator.FloatTensor``-style property: ``torch.tensor`` of ``dtype`` on
    the accelerator's device."""

    def make(self: DeepSpeedAccelerator) -> Callable[..., torch.Tensor]:
        return functools.partial(torch.tensor, dtype=dtype, device=self.device_name())

    return property(make)


class DeepSpeedAccelerator(Pinning):
    """One ds accelerator seen through DeepSpeed's abstract accelerator interface."""

    def __init__(self, accelerator: Any) -> None:
        self._ds = accelerator
        self._name = accelerator.name()
        self._communication_backend_name = accelerator.communication_backend_name()
        self._compile_backend = "inductor"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_ds":
            raise AttributeError(name)
        return getattr(self._ds, name)

    def __repr__(self) -> str:
        return f"<deepspeed accelerator {self._name!r} served by ds ({type(self._ds).__name__})>"

    # -- what kind of device -------------------------------------------------------------------
    def _is_gpu(self) -> bool:
        return self._name in ("cuda", "rocm")

    def is_synchronized_device(self) -> bool:
        return not self._ds.capabilities().has_streams

    def use_host_timers(self) -> bool:
        return self.is_synchronized_device()

    def resolves_data_dependency(self) -> bool:
        return self.is_synchronized_device()

    def handles_memory_backpressure(self) -> bool:
        return self.is_synchronized_device()

    # -- devices and RNG --------------------------------------------------------------------
    def device_name(self, device_index: int | None = None) -> str:
        return str(self._ds.device_name(device_index))

    def random(self) -> Any:
        return torch.random

    def default_generator(self, index: int) -> torch.Generator:
        if self._is_gpu():
            return torch.cuda.default_generators[index]
        return torch.default_generator

    # -- streams, events, graphs ------------------------------------------------------------
    @property
    def Stream(self) -> Any:
        return type(self._ds.new_stream())

    @property
    def Event(self) -> Callable[..., Any]:
        return self._ds.new_event

    def create_graph(self) -> Any:
        return torch.cuda.CUDAGraph() if self._is_gpu() else None

    def capture_to_graph(self, graph: Any, pool: Any = None, stream: Any = None) -> Any:
        if self._is_gpu():
            return torch.cuda.graph(graph, pool, stream)
        from contextlib import nullcontext

        return nullcontext()

    def replay_graph(self, graph: Any) -> None:
        if self._is_gpu():
            graph.replay()

    def range_push(self, msg: str) -> None:
        if self._is_gpu():
            torch.cuda.nvtx.range_push(msg)

    def range_pop(self) -> None:
        if self._is_gpu():
            torch.cuda.nvtx.range_pop()

    def lazy_call(self, callback: Callable[[], Any]) -> None:
        if self._is_gpu():
            torch.cuda._lazy_call(callback)
        else:
            callback()

    # -- memory -----------------------------------------------------------------------------
    def memory_cached(self, device_index: int | None = None) -> int:
        return int(self._ds.memory_reserved(device_index))

    def max_memory_cached(self, device_index: int | None = None) -> int:
        return self.max_memory_reserved(device_index)

    def max_memory_reserved(self, device_index: int | None = None) -> int:
        if self._is_gpu():
            return int(torch.cuda.max_memory_reserved(device_index))
        return int(self._ds.memory_reserved(device_index))

    def reset_max_memory_allocated(self, device_index: int | None = None) -> None:
        self._ds.reset_peak_memory_stats(device_index)

    def reset_max_memory_cached(self, device_index: int | None = None) -> None:
        self._ds.reset_peak_memory_stats(device_index)

    # -- typed tensor constructors on this device -------------------------------------------
    BFloat16Tensor = _typed_tensor(torch.bfloat16)
    ByteTensor = _typed_tensor(torch.uint8)
    DoubleTensor = _typed_tensor(torch.float64)
    FloatTensor = _typed_tensor(torch.float32)
    HalfTensor = _typed_tensor(torch.float16)
    IntTensor = _typed_tensor(torch.int32)
    LongTensor = _typed_tensor(torch.int64)

    # -- kernels: ds's are prebuilt, nothing is compiled ------------------------------------
    def is_triton_supported(self) -> bool:
        if not self._is_gpu():
            return False
        import importlib.util

        return importlib.util.find_spec("triton") is not None

    def prefer_triton_grouped_mm(self) -> bool:
        return False

    def op_builder_dir(self) -> str:
        return "deepspeed.ops.op_builder"

    def create_op_builder(self, class_name: str) -> Any:
        builder = self.get_op_builder(class_name)
        return builder() if builder is not None else None

    def get_op_builder(self, class_name: str) -> Any:
        from ds.full.compat.deepspeed.ops import op_builder

        return getattr(op_builder, class_name, None)

    def build_extension(self) -> Any:
        from ds.full.compat.deepspeed._missing import missing_class

        return missing_class(
            "deepspeed.accelerator.build_extension", "compiling C++/CUDA extensions",
            "ds ships its kernels prebuilt (ds-ops-kernels); 'ds report' lists them",
        )  # fmt: skip

    def export_envs(self) -> list[str]:
        return ["NCCL", "LD_LIBRARY", "PATH"] if self._is_gpu() else []

    def get_compile_backend(self) -> str:
        return self._compile_backend

    def set_compile_backend(self, backend: str) -> None:
        supported = torch._dynamo.list_backends(exclude_tags=())
        if backend not in supported:
            raise ValueError(
                f"{backend} is not a torch compile backend here; use one of {supported}"
            )
        self._compile_backend = backend


__all__ = ["DeepSpeedAccelerator"]
