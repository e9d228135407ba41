"""Identity of an accelerator whose device carries no index (the CPU, Apple's MPS)."""

from __future__ import annotations

import torch


class UnindexedDevice:
    """The identity methods of an accelerator registered as ``_NAME`` whose every device is
    ``torch.device(_DEVICE)``: no variable selects a device (every rank sees the same one), and
    collectives go through host memory with gloo (torch has no MPS collective backend)."""

    _NAME: str
    _DEVICE: str

    def name(self) -> str:
        return self._NAME

    def device_name(self, index: int | None = None) -> str:
        return self._DEVICE

    def device(self, index: int | None = None) -> torch.device:
        return torch.device(self._DEVICE)

    def current_device_name(self) -> str:
        return self._DEVICE

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envs(self) -> list[str]:
        return []

    def set_visible_devices_envs(self, env: dict[str, str], local_ranks: list[int]) -> None:
        return None
