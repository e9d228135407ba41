"""Host buffers a ZeRO strategy pins for CPU offload (``offload_optimizer.pin_memory``).

Pinning goes through the accelerator's ``pin_memory``, which is where the pinned-memory backend
is chosen (``DS_PIN_MEMORY_BACKEND``, see :mod:`ds.accel.pinning`); an accelerator without pinned
memory (the CPU under the default backend) leaves buffers as they are. The strategy owns what it
pinned and hands it back on ``engine.destroy()``, so a process that builds several engines does
not keep their locked pages until garbage collection.
"""

from __future__ import annotations

import torch

from ds.interfaces.accelerator import Accelerator


class HostPins:
    """Pins host tensors through ``accelerator`` when ``enabled`` and it has pinned memory, and
    releases them all at once."""

    def __init__(self, accelerator: Accelerator | None, enabled: bool) -> None:
        pins = enabled and accelerator is not None and accelerator.capabilities().has_pinned_memory
        self._acc = accelerator if pins else None
        self._held: list[torch.Tensor] = []

    @property
    def active(self) -> bool:
        return self._acc is not None

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (a host tensor) page-locked, or ``t`` itself when nothing pins."""
        if self._acc is None:
            return t
        pinned = self._acc.pin_memory(t)
        self._held.append(pinned)
        return pinned

    def release(self) -> None:
        """Unpin everything pinned here (views stay valid; the memory is only unlocked)."""
        if self._acc is not None:
            for t in self._held:
                self._acc.unpin_memory(t)
        self._held.clear()


__all__ = ["HostPins"]
