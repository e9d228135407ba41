"""ds.ops: prebuilt native kernels (CPU optimizers, quantizers, async I/O) and Triton kernels.

Importing ``ds.ops`` is cheap: it loads neither torch nor the native module. They load on first
use (``info()``, a kernel call, an optimizer), and nothing is ever compiled at import or run time:
the native module ``ds.ops._C`` was built when the wheel was built.
"""

from __future__ import annotations

from typing import Any

__all__ = ["info", "simd_level"]


def simd_level() -> str:
    """SIMD variant the native kernels use now: ``avx512``, ``avx2``, ``neon`` or ``scalar``."""
    from ds.ops._native import native

    return str(native().simd_level())


def info() -> dict[str, str]:
    """Build and run-time facts of the native kernels (SIMD level, build flags, threads)."""
    from ds.ops._native import native_info

    return native_info()


def __getattr__(name: str) -> Any:
    # Submodules on attribute access (ds.ops.optim.CPUAdam) without importing them up front.
    if name in {"optim", "cpu_optim", "provider"}:
        import importlib

        return importlib.import_module(f"ds.ops.{name}")
    raise AttributeError(f"module 'ds.ops' has no attribute {name!r}")
