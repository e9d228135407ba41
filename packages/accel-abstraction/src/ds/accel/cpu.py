"""The CPU accelerator: always available, synchronous, gloo for communication."""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from ds.accel.host import AllFloatDtypes, HostRandom
from ds.accel.pinning import HostPinning
from ds.accel.streams import StandInStreams
from ds.accel.unindexed import UnindexedDevice
from ds.interfaces.accelerator import AcceleratorCapabilities


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes (Linux); empty elsewhere."""
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    except OSError:
        pass
    return out


def _rss() -> tuple[int, int]:
    """(current RSS, peak RSS) of this process in bytes."""
    cur = peak = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    cur = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
    except OSError:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        cur = peak
    return cur, peak


class CpuAccelerator(UnindexedDevice, StandInStreams, HostRandom, AllFloatDtypes, HostPinning):
    """Host CPU. Memory figures are the process RSS (allocated) and system RAM (total)."""

    _NAME = _DEVICE = "cpu"

    def __init__(self) -> None:
        self._peak_base = 0

    # identity -------------------------------------------------------------------
    def is_available(self) -> bool:
        return True

    def capabilities(self) -> AcceleratorCapabilities:
        return AcceleratorCapabilities(
            has_streams=False,
            has_events=False,
            has_pinned_memory=self._has_pinned_memory(),
            is_synchronized_device=True,
        )

    # device management ---------------------------------------------------------------
    def device_count(self) -> int:
        # One logical device per rank; LOCAL_WORLD_SIZE tells how many ranks share the host.
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))

    def current_device(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    def set_device(self, index: int) -> None:
        return None

    def synchronize(self, index: int | None = None) -> None:
        return None

    # memory ---------------------------------------------------------------------------
    def memory_allocated(self, index: int | None = None) -> int:
        return _rss()[0]

    def max_memory_allocated(self, index: int | None = None) -> int:
        return max(_rss()[1], self._peak_base)

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        # The kernel's peak (VmHWM) can be reset through /proc/self/clear_refs on Linux.
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._peak_base = 0
        except OSError:
            self._peak_base = _rss()[0]

    def memory_reserved(self, index: int | None = None) -> int:
        return _rss()[0]

    def total_memory(self, index: int | None = None) -> int:
        info = _meminfo()
        if "MemTotal" in info:
            return info["MemTotal"]
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    def available_memory(self, index: int | None = None) -> int:
        info = _meminfo()
        return info.get("MemAvailable", self.total_memory())

    def memory_stats(self, index: int | None = None) -> Mapping[str, int]:
        cur, peak = _rss()
        return {
            "allocated_bytes.all.current": cur,
            "allocated_bytes.all.peak": peak,
            "total_bytes": self.total_memory(),
            "available_bytes": self.available_memory(),
        }

    def empty_cache(self) -> None:
        return None

    # host memory ------------------------------------------------------------------------
    # pin_memory/is_pinned/unpin_memory: HostPinning. The CPU runtime has no pinning (there is
    # no device to transfer to); DS_PIN_MEMORY_BACKEND=native locks host pages all the same.
    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cpu"
