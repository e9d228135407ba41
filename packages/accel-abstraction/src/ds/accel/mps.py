"""Apple Metal (MPS) accelerator: one device, no user streams, gloo for communication."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ds.accel.pinning import HostPinning
from ds.accel.streams import HostEvent, StandInStreams
from ds.accel.unindexed import UnindexedDevice
from ds.interfaces.accelerator import AcceleratorCapabilities


def _mps() -> Any:
    return torch.mps


class MpsAccelerator(UnindexedDevice, StandInStreams, HostPinning):
    _NAME = _DEVICE = "mps"

    def is_available(self) -> bool:
        backend = getattr(torch.backends, "mps", None)
        return bool(backend is not None and backend.is_available())

    def capabilities(self) -> AcceleratorCapabilities:
        return AcceleratorCapabilities(
            has_streams=False,
            has_pinned_memory=self._has_pinned_memory(),
            supports_bf16=self.is_bf16_supported(),
        )

    def device_count(self) -> int:
        return 1 if self.is_available() else 0

    def current_device(self) -> int:
        return 0

    def set_device(self, index: int) -> None:
        if index != 0:
            raise ValueError(f"MPS has exactly one device (index 0); got {index}")

    def synchronize(self, index: int | None = None) -> None:
        _mps().synchronize()

    def new_event(self, enable_timing: bool = False) -> Any:
        event_mod = getattr(_mps(), "event", None)
        if event_mod is not None and hasattr(event_mod, "Event"):
            return event_mod.Event(enable_timing=enable_timing)
        return HostEvent(enable_timing)

    def memory_allocated(self, index: int | None = None) -> int:
        return int(_mps().current_allocated_memory())

    def max_memory_allocated(self, index: int | None = None) -> int:
        # MPS keeps no peak counter; the driver's allocation is the closest upper bound.
        return int(_mps().driver_allocated_memory())

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        return None

    def memory_reserved(self, index: int | None = None) -> int:
        return int(_mps().driver_allocated_memory())

    def total_memory(self, index: int | None = None) -> int:
        rec = getattr(_mps(), "recommended_max_memory", None)
        return int(rec()) if rec is not None else 0

    def available_memory(self, index: int | None = None) -> int:
        return max(0, self.total_memory() - self.memory_allocated())

    def memory_stats(self, index: int | None = None) -> Mapping[str, int]:
        return {
            "allocated_bytes.all.current": self.memory_allocated(),
            "reserved_bytes.all.current": self.memory_reserved(),
        }

    def empty_cache(self) -> None:
        _mps().empty_cache()

    def manual_seed(self, seed: int) -> None:
        _mps().manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        _mps().manual_seed(seed)

    def initial_seed(self) -> int:
        return int(torch.initial_seed())

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        return _mps().get_rng_state()

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        _mps().set_rng_state(state)

    def is_bf16_supported(self) -> bool:
        # bf16 kernels on MPS arrived with macOS 14; torch reports it through a tensor probe.
        if not self.is_available():
            return False
        try:
            torch.zeros(1, dtype=torch.bfloat16, device="mps")
        except (RuntimeError, TypeError):
            return False
        return True

    def is_fp16_supported(self) -> bool:
        return True

    def supported_dtypes(self) -> list[torch.dtype]:
        out = [torch.float32, torch.float16]
        if self.is_bf16_supported():
            out.append(torch.bfloat16)
        return out

    # pin_memory/is_pinned/unpin_memory: HostPinning (unified memory: the device runtime has
    # nothing to pin).

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "mps"
