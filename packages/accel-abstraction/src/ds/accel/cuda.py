"""The CUDA accelerator (NVIDIA and ROCm builds of torch): streams, events, pinned memory, nccl."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ds.accel.pinning import HostPinning
from ds.interfaces.accelerator import AcceleratorCapabilities
from ds.interfaces.errors import AcceleratorError


class CudaNames:
    """The identity of an accelerator whose devices are torch's ``cuda:N`` (real or simulated):
    its registered name is ``_NAME``."""

    _NAME = "cuda"

    def name(self) -> str:
        return self._NAME

    def device_name(self, index: int | None = None) -> str:
        return "cuda" if index is None else f"cuda:{index}"

    def device(self, index: int | None = None) -> torch.device:
        return torch.device(self.device_name(index))


class CudaAccelerator(CudaNames, HostPinning):
    """NVIDIA and ROCm devices through torch.cuda."""

    def is_available(self) -> bool:
        return bool(torch.cuda.is_available())

    def capabilities(self) -> AcceleratorCapabilities:
        return AcceleratorCapabilities(
            supports_bf16=self.is_bf16_supported(),
            supports_triton=self._has_triton(),
            supports_graphs=True,
        )

    @staticmethod
    def _has_triton() -> bool:
        import importlib.util

        return importlib.util.find_spec("triton") is not None

    def communication_backend_name(self) -> str:
        # ROCm builds of torch expose HIP as "cuda"; their collective library answers to "nccl".
        return "nccl"

    def visible_devices_envs(self) -> list[str]:
        if getattr(torch.version, "hip", None):
            return ["HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"]
        return ["CUDA_VISIBLE_DEVICES"]

    def set_visible_devices_envs(self, env: dict[str, str], local_ranks: list[int]) -> None:
        for key in self.visible_devices_envs():
            env[key] = ",".join(str(r) for r in local_ranks)

    # device management ---------------------------------------------------------------
    def device_count(self) -> int:
        return int(torch.cuda.device_count())

    def current_device(self) -> int:
        return int(torch.cuda.current_device())

    def current_device_name(self) -> str:
        return f"cuda:{self.current_device()}"

    def set_device(self, index: int) -> None:
        # The rank's device (ds.full binds LOCAL_RANK's); an index past the visible devices is
        # a launch mistake, said plainly instead of torch's "invalid device ordinal".
        count = self.device_count()
        if not 0 <= index < count:
            import os

            seen = os.environ.get("CUDA_VISIBLE_DEVICES")
            where = f"CUDA_VISIBLE_DEVICES={seen!r}" if seen is not None else "all of the driver's"
            raise AcceleratorError(
                f"cuda device {index} does not exist: {count} device(s) are visible ({where}); "
                "start at most that many ranks per node"
            )
        torch.cuda.set_device(index)

    def synchronize(self, index: int | None = None) -> None:
        torch.cuda.synchronize(index)

    # streams and events ------------------------------------------------------------------
    def stream(self, stream: Any) -> Any:
        return torch.cuda.stream(stream)

    def current_stream(self, index: int | None = None) -> Any:
        return torch.cuda.current_stream(index)

    def default_stream(self, index: int | None = None) -> Any:
        return torch.cuda.default_stream(index)

    def new_stream(self) -> Any:
        return torch.cuda.Stream()

    def new_event(self, enable_timing: bool = False) -> Any:
        return torch.cuda.Event(enable_timing=enable_timing)

    # memory ---------------------------------------------------------------------------
    def memory_allocated(self, index: int | None = None) -> int:
        return int(torch.cuda.memory_allocated(index))

    def max_memory_allocated(self, index: int | None = None) -> int:
        return int(torch.cuda.max_memory_allocated(index))

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        torch.cuda.reset_peak_memory_stats(index)

    def memory_reserved(self, index: int | None = None) -> int:
        return int(torch.cuda.memory_reserved(index))

    def total_memory(self, index: int | None = None) -> int:
        idx = self.current_device() if index is None else index
        return int(torch.cuda.get_device_properties(idx).total_memory)

    def available_memory(self, index: int | None = None) -> int:
        free, _total = torch.cuda.mem_get_info(index)
        return int(free)

    def memory_stats(self, index: int | None = None) -> Mapping[str, int]:
        return {k: int(v) for k, v in torch.cuda.memory_stats(index).items() if isinstance(v, int)}

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    # RNG ------------------------------------------------------------------------------
    def manual_seed(self, seed: int) -> None:
        torch.cuda.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.cuda.manual_seed_all(seed)

    def initial_seed(self) -> int:
        return int(torch.cuda.initial_seed())

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        return torch.cuda.get_rng_state("cuda" if index is None else index)

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        torch.cuda.set_rng_state(state, "cuda" if index is None else index)

    # dtypes ---------------------------------------------------------------------------
    def is_bf16_supported(self) -> bool:
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())

    def is_fp16_supported(self) -> bool:
        return True

    def supported_dtypes(self) -> list[torch.dtype]:
        out = [torch.float32, torch.float16, torch.float64]
        if self.is_bf16_supported():
            out.insert(1, torch.bfloat16)
        return out

    # host memory ------------------------------------------------------------------------
    # pin_memory/is_pinned/unpin_memory: HostPinning over the CUDA runtime's page locking.
    _device_has_pinned_memory = True

    def _device_pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.pin_memory()

    def _device_is_pinned(self, tensor: torch.Tensor) -> bool:
        return bool(tensor.is_pinned())

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cuda"
