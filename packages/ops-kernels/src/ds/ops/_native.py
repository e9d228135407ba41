"""Access to the compiled module ``ds.ops._C`` and its thread pool."""

from __future__ import annotations

import functools
import os
from types import ModuleType

from ds.interfaces.errors import KernelError

_pool_threads = 0


def _forget_pool_size() -> None:
    # The native pool restarts single-threaded in a forked child; size it again on next use.
    global _pool_threads
    _pool_threads = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_size)


@functools.cache
def native() -> ModuleType:
    try:
        from ds.ops import _C
    except ImportError as e:
        raise KernelError(
            "the native kernels of ds-ops-kernels (ds.ops._C) are not importable: "
            f"{e}. Reinstall the distribution (pip install ds-ops-kernels, or "
            "pip install --no-build-isolation -e packages/ops-kernels in a checkout); "
            "they are built at install time, never at run time."
        ) from e
    return _C


def sync_threads() -> None:
    """Size the kernel pool to torch.get_num_threads() (cheap when unchanged)."""
    global _pool_threads
    import torch

    n = max(1, torch.get_num_threads())
    if n != _pool_threads:
        native().set_num_threads(n)
        _pool_threads = n


def native_info() -> dict[str, str]:
    c = native()
    sync_threads()
    return {
        "provider": "cpu",
        "simd_level": str(c.simd_level()),
        "simd_detected": str(c.detected_simd_level()),
        "simd_built": str(c.simd_levels_built()),
        "compiler": str(c.build_info()),
        "build_flags": str(c.build_flags()),
        "arch": str(c.build_arch()),
        "threads": str(c.get_num_threads()),
        "tensor_exchange": "dlpack",
    }
