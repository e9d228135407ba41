"""``deepspeed.accelerator.real_accelerator``: ``get_accelerator`` / ``set_accelerator``.

``get_accelerator()`` is the accelerator ``ds.full`` picks (``DS_ACCELERATOR``, else cuda when
available, else cpu), wrapped in DeepSpeed's accelerator interface; ``set_accelerator(obj)``
replaces it for this process."""

from __future__ import annotations

from typing import Any

from ds.full.compat.deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
from ds.interfaces import registry
from ds.interfaces.errors import ConfigError

SUPPORTED_ACCELERATOR_LIST = ["cuda", "cpu", "xpu", "npu", "mps", "hpu", "mlu", "sdaa", "supa"]

ds_accelerator: DeepSpeedAccelerator | None = None


def _make(name: str) -> DeepSpeedAccelerator:
    try:
        impl = registry.get(registry.ACCELERATORS, name)
    except Exception as exc:
        raise ConfigError(
            f"DS_ACCELERATOR={name!r}: ds has no such accelerator ({exc}); use cpu or cuda"
        ) from exc
    return DeepSpeedAccelerator(impl())


def get_accelerator() -> DeepSpeedAccelerator:
    global ds_accelerator
    if ds_accelerator is None:
        from ds.full.training import _accelerator_name

        ds_accelerator = _make(_accelerator_name())
    return ds_accelerator


def set_accelerator(accel_obj: Any) -> None:
    """Use ``accel_obj`` (a DeepSpeedAccelerator, or a ds accelerator, which gets wrapped)."""
    global ds_accelerator
    if not isinstance(accel_obj, DeepSpeedAccelerator):
        if not callable(getattr(accel_obj, "communication_backend_name", None)):
            raise ConfigError(
                f"set_accelerator({type(accel_obj).__name__}): not an accelerator; pass "
                "deepspeed.accelerator.cpu_accelerator.CPU_Accelerator() or another accelerator"
            )
        accel_obj = DeepSpeedAccelerator(accel_obj)
    ds_accelerator = accel_obj


def is_current_accelerator_supported() -> bool:
    return get_accelerator()._name in SUPPORTED_ACCELERATOR_LIST


def _reset_for_env() -> None:
    """Forget the chosen accelerator (a later get_accelerator() reads DS_ACCELERATOR again)."""
    global ds_accelerator
    ds_accelerator = None


__all__ = [
    "SUPPORTED_ACCELERATOR_LIST",
    "get_accelerator",
    "is_current_accelerator_supported",
    "set_accelerator",
]
