"""The engine's mixed-precision cast (DeepSpeed's names for its steps).

Parameters take the precision mode's dtype (bf16/fp16); buffers keep the dtype they were loaded
in unless ``data_types.buffer_dtype`` names one, so fp32 buffers such as a rotary embedding's
``inv_freq`` keep their accuracy. ``data_types.param_dtype``, when set, must agree with the mode:
the optimizer, master weights and gradient reduction all derive the model dtype from it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ds.interfaces.errors import ConfigError
from ds.zero.dtypes import named_dtype

# What a cast touches: floating tensors (integer buffers such as position ids stay as they are).
_CASTABLE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _mode_dtype(engine: Any) -> torch.dtype | None:
    """The dtype the fp16/bf16 mode trains in (None in fp32)."""
    if engine.fp16_enabled():
        return torch.float16
    if engine.bfloat16_enabled():
        return torch.bfloat16
    return None


class PrecisionConfigError(ConfigError, AssertionError):
    """``data_types.param_dtype`` contradicts the precision mode (an AssertionError in
    DeepSpeed, so it is one here too)."""


class EnginePrecision:
    """Mixed into :class:`ds.zero.engine.ZeroEngine`."""

    _config: Any
    module: torch.nn.Module
    fp16_enabled: Callable[[], bool]
    bfloat16_enabled: Callable[[], bool]

    def _assert_valid_mixed_precision_config(self) -> None:
        requested = named_dtype("data_types.param_dtype", self._config.param_dtype)
        if requested is None:
            return
        mode = _mode_dtype(self) or torch.float32
        if requested != mode:
            raise PrecisionConfigError(
                f"data_types.param_dtype={self._config.param_dtype!r} conflicts with the precision "
                f"mode (model dtype {mode}); set the matching fp16/bf16 'enabled' flag or drop "
                "data_types.param_dtype"
            )

    def _mixed_precision_dtypes(self) -> tuple[torch.dtype | None, torch.dtype | None]:
        """(parameter dtype, buffer dtype) for the cast; None leaves that kind as it is."""
        buffers = named_dtype("data_types.buffer_dtype", self._config.buffer_dtype)
        return _mode_dtype(self), buffers

    def _cast_module_mixed_precision(
        self,
        param_dtype: torch.dtype | None,
        buffer_dtype: torch.dtype | None,
        is_zero_init_model: bool,
    ) -> None:
        """Cast in place, keeping each tensor object (and the attributes ds.zero.Init put on it).

        A model built under ds.zero.Init already holds its parameters in the configured dtype,
        so ``is_zero_init_model`` leaves them alone; buffers are never partitioned."""
        with torch.no_grad():
            if param_dtype is not None and not is_zero_init_model:
                for p in self.module.parameters():
                    if p.dtype in _CASTABLE and p.dtype != param_dtype:
                        p.data = p.data.to(param_dtype)
            if buffer_dtype is not None:
                for b in self.module.buffers():
                    if b.dtype in _CASTABLE and b.dtype != buffer_dtype:
                        b.data = b.data.to(buffer_dtype)


__all__ = ["EnginePrecision", "PrecisionConfigError"]
