"""``deepspeed.OnDevice``: build modules with their tensors created on a given device (``meta``
for a model that takes no memory until it is loaded) and floating-point tensors in a given dtype.

Tensor factories called inside the block (``torch.empty``, ``zeros``, ``ones``, ``full``, ...,
which is how ``nn.Module`` constructors allocate parameters and buffers) default to ``device``,
and their floating-point results become ``dtype``; a call naming its own device keeps it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_FACTORIES = frozenset(
    {
        torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn,
        torch.empty_strided, torch.eye, torch.tensor,
    }
)  # fmt: skip


class _OnDeviceMode(TorchFunctionMode):
    def __init__(self, device: Any, dtype: torch.dtype | None) -> None:
        super().__init__()
        self.device, self.dtype = device, dtype

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func not in _FACTORIES:
            return func(*args, **kwargs)
        if kwargs.get("device") is None:
            kwargs["device"] = self.device
        out = func(*args, **kwargs)
        if self.dtype is not None and out.is_floating_point() and kwargs.get("dtype") is None:
            out = out.to(self.dtype)
        return out


class OnDevice:
    """``with OnDevice(dtype=torch.float16, device="meta"): model = MyModel()``."""

    def __init__(self, dtype: torch.dtype | None, device: Any = "meta", enabled: bool = True):
        self.dtype, self.device, self.enabled = dtype, device, enabled
        self._mode: _OnDeviceMode | None = None

    def __enter__(self) -> OnDevice:
        if self.enabled:
            self._mode = _OnDeviceMode(self.device, self.dtype)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None


__all__ = ["OnDevice"]
