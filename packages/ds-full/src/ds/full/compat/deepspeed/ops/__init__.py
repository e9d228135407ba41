"""``deepspeed.ops``: the optimizers (``adam``, ``adagrad``, ``lion``), the op builders
(``op_builder``: ds's prebuilt kernels) and ``__compatible_ops__`` / ``__installed_ops__``."""

from __future__ import annotations

from typing import Any

from ds.full.compat.deepspeed.ops import adagrad, adam, lion, op_builder


def _compatible() -> dict[str, bool]:
    from ds.full.compat.deepspeed.ops.op_builder.all_ops import ALL_OPS
    from ds.full.compat.deepspeed.ops.op_builder.builder import probe_is_compatible

    return {name: probe_is_compatible(b) for name, b in ALL_OPS.items()}


def __getattr__(name: str) -> Any:
    # Probed on first access (it imports the kernels), then kept: edits to the dict persist.
    if name in ("__compatible_ops__", "__installed_ops__"):
        globals()[name] = _compatible()
        return globals()[name]
    raise AttributeError(f"deepspeed.ops.{name} has no ds equivalent")


__all__ = ["adagrad", "adam", "lion", "op_builder"]
