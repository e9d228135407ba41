"""ds.accel: one Accelerator object describing the device type this process computes on.

``get_accelerator()`` picks it once per process, in this order:

1. ``DS_ACCELERATOR=<name>`` when set (an unknown or unavailable name is an error listing the
   valid ones; ds never silently picks something else);
2. accelerators from other distributions registered in the ``ds.accelerators`` entry-point group
   (xpu, npu, hpu, ...), in name order, first one whose ``is_available()`` is true;
3. ``cuda`` (NVIDIA or ROCm builds of torch) when a device is visible;
4. ``mps`` on Apple silicon;
5. ``cpu``.

``simgpu`` (simulated CUDA devices, :mod:`ds.sim.accelerator`) is never detected: only
``DS_ACCELERATOR=simgpu`` or ``set_accelerator("simgpu")`` selects it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ds.interfaces import registry
from ds.interfaces.accelerator import Accelerator, AcceleratorCapabilities
from ds.interfaces.errors import AcceleratorError

BUILTIN = ("cuda", "mps", "cpu")
NOT_DETECTED = ("simgpu",)
ENV_VAR = "DS_ACCELERATOR"

_lock = threading.Lock()
_current: Accelerator | None = None


def available_accelerators() -> dict[str, str]:
    """Every accelerator name ds knows (built in and plug-ins) -> the value it loads from."""
    return {
        name: p.value for name, p in sorted(registry.list_providers(registry.ACCELERATORS).items())
    }


def _instantiate(name: str) -> Accelerator:
    try:
        factory: Any = registry.get(registry.ACCELERATORS, name)
    except LookupError:
        names = ", ".join(available_accelerators()) or "none"
        raise AcceleratorError(
            f"{ENV_VAR}={name!r} is not a known accelerator; valid names: {names}. "
            f"Unset {ENV_VAR} to detect automatically, or install the distribution providing {name!r}."
        ) from None
    accel = factory()
    if not isinstance(accel, Accelerator):
        raise AcceleratorError(
            f"the accelerator registered as {name!r} ({type(accel).__name__}) does not implement "
            "ds.interfaces.accelerator.Accelerator; fix or uninstall that plug-in"
        )
    return accel


def _detect() -> Accelerator:
    plugins = [n for n in available_accelerators() if n not in BUILTIN + NOT_DETECTED]
    for name in [*plugins, *BUILTIN]:
        try:
            accel = _instantiate(name)
        except AcceleratorError:
            continue
        if accel.is_available():
            return accel
    raise AcceleratorError(
        "no accelerator is available, not even cpu; reinstall ds-accel-abstraction"
    )


def _select() -> Accelerator:
    requested = os.environ.get(ENV_VAR, "").strip().lower()
    if not requested:
        return _detect()
    accel = _instantiate(requested)
    if not accel.is_available():
        usable = [n for n in available_accelerators() if _usable(n)]
        raise AcceleratorError(
            f"{ENV_VAR}={requested!r} is installed but not available on this machine "
            f"(no {requested} device is visible); usable here: {', '.join(usable)}"
        )
    return accel


def _usable(name: str) -> bool:
    try:
        return _instantiate(name).is_available()
    except AcceleratorError:
        return False


def get_accelerator() -> Accelerator:
    """The process-wide accelerator (chosen on first call; see the module docstring)."""
    global _current
    if _current is None:
        with _lock:
            if _current is None:
                _current = _select()
    return _current


def set_accelerator(accel: Accelerator | str) -> Accelerator:
    """Force the process-wide accelerator, by object or registered name."""
    global _current
    obj = _instantiate(accel) if isinstance(accel, str) else accel
    if not obj.is_available():
        raise AcceleratorError(f"accelerator {obj.name()!r} is not available on this machine")
    with _lock:
        _current = obj
    return obj


def reset_accelerator() -> None:
    """Forget the chosen accelerator so the next get_accelerator() detects again."""
    global _current
    with _lock:
        _current = None


__all__ = [
    "Accelerator",
    "AcceleratorCapabilities",
    "available_accelerators",
    "get_accelerator",
    "reset_accelerator",
    "set_accelerator",
]
