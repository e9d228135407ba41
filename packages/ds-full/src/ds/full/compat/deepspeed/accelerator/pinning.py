"""DeepSpeed's host-pinning methods of an accelerator: the native backend
(``DS_PIN_MEMORY_BACKEND=native``, mlock'ed pages from ``deepspeed.utils.pin_memory``) when it is
selected, the ds accelerator's own ``pin_memory`` otherwise; what is pinned is counted by
``deepspeed.utils.pin_memory_tracker``."""

from __future__ import annotations

from typing import Any

import torch


def _native() -> Any:
    from ds.full.compat.deepspeed.utils.pin_memory import get_active_native_pinned_memory

    return get_active_native_pinned_memory()


def _track(num_bytes: int) -> None:
    from ds.full.compat.deepspeed.utils.pin_memory_tracker import track_pinned_memory

    track_pinned_memory(num_bytes)


def _host_only(device: Any) -> None:
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ValueError(
            f"pinned buffers live on the host: device must be cpu, got {device!r}"
        ) from err
    if dev.type != "cpu":
        raise ValueError(f"pinned buffers live on the host: device must be cpu, got {device!r}")


class Pinning:
    """Mixed into ``DeepSpeedAccelerator``; ``self._ds`` is the ds accelerator."""

    _ds: Any

    def _pins_host_memory(self) -> bool:
        # A device without pinned memory (the CPU) hands tensors back as they are: nothing to count.
        return bool(self._ds.capabilities().has_pinned_memory)

    def _torch_pin_memory(self, tensor: torch.Tensor, align_bytes: int = 1) -> torch.Tensor:
        return self._ds.pin_memory(tensor)  # type: ignore[no-any-return]

    def _torch_is_pinned(self, tensor: torch.Tensor) -> bool:
        return bool(self._ds.is_pinned(tensor))

    def _pin_fresh(self, template: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        pins = _native()
        numel = 1
        for dim in shape:
            numel *= int(dim)
        if pins is not None or self._pins_host_memory():
            _track(numel * template.element_size())
        if pins is not None:
            return pins.pin_empty(template, shape)  # type: ignore[no-any-return]
        empty = torch.empty(shape, dtype=template.dtype)
        return self._ds.pin_memory(empty) if self._pins_host_memory() else empty  # type: ignore[no-any-return]

    def pin_memory(
        self, tensor: torch.Tensor, make_copy: bool = True, match_shape: bool = True
    ) -> torch.Tensor:
        pins = _native()
        if pins is not None:
            _track(tensor.nbytes)
            return pins.pin(tensor, make_copy=make_copy, match_shape=match_shape)  # type: ignore[no-any-return]
        if make_copy:
            if self._pins_host_memory():
                _track(tensor.nbytes)
            return self._torch_pin_memory(tensor)
        # Only the shape and dtype matter: lock a fresh buffer rather than copy the template.
        return self._pin_fresh(tensor, tuple(tensor.shape) if match_shape else (tensor.numel(),))

    def pin_empty(self, *size: Any, dtype: torch.dtype, device: Any = "cpu") -> torch.Tensor:
        _host_only(device)
        one = len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size))
        shape = tuple(size[0]) if one else tuple(size)
        return self._pin_fresh(torch.empty(0, dtype=dtype), shape)

    def pin_empty_like(
        self, tensor: torch.Tensor, device: Any = "cpu", dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        _host_only(device)
        template = torch.empty(0, dtype=tensor.dtype if dtype is None else dtype)
        return self._pin_fresh(template, tuple(tensor.shape))

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        pins = _native()
        if pins is not None and pins.is_pinned(tensor):
            return True
        if tensor.device.type == "meta":
            return False
        return self._torch_is_pinned(tensor)

    def unpin_memory(self, tensor: torch.Tensor) -> bool | None:
        """Release a natively pinned tensor now (True if it was); torch-pinned memory is released
        by garbage collection, so this returns None for it."""
        pins = _native()
        return pins.unpin(tensor) if pins is not None else None


__all__ = ["Pinning"]
