"""``deepspeed.ops.op_builder.builder.OpBuilder``: DeepSpeed's op builders, answered from ds's
prebuilt kernels.

DeepSpeed compiles its C++/CUDA ops on first use (JIT) or at install time. ds builds its kernels
once, when ds-ops-kernels is installed (nanobind C++ with runtime SIMD dispatch, Triton on GPUs),
and never compiles at run time. So a builder here answers ``is_compatible()`` with whether ds has
that kernel on this machine, and ``load()`` returns ds's module for it; a builder of an op ds does
not have is never compatible and its ``load()`` raises naming the op.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, ClassVar

from ds.full.compat.deepspeed._missing import FeatureNotAvailableError


def _native_cpu() -> bool:
    try:
        from ds.ops._native import native

        native()
        return True
    except Exception:
        return False


def get_default_compute_capabilities() -> str:
    return "6.0;6.1;7.0"


class OpBuilder:
    """A DeepSpeed op, served by ds's module ``MODULE`` when ``available()`` says so."""

    NAME = "deepspeed_not_implemented"
    MODULE: str | None = None
    FEATURE = ""
    available: Callable[[], bool] = staticmethod(lambda: False)
    _loaded_ops: ClassVar[dict[str, Any]] = {}

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.NAME
        self.error_log: str | None = None
        self.enable_bf16 = False

    def absolute_name(self) -> str:
        return f"deepspeed.ops.{self.NAME}_op"

    def sources(self) -> list[str]:
        return []  # nothing is compiled: ds's kernels are prebuilt

    def include_paths(self) -> list[str]:
        return []

    def is_compatible(self, verbose: bool = False) -> bool:
        ok = self.MODULE is not None and bool(type(self).available())
        if not ok:
            self.error_log = f"{self.NAME}: {self._why()}"
        return ok

    def _why(self) -> str:
        if self.MODULE is None:
            return f"ds has no {self.FEATURE or self.NAME} kernel"
        return "ds's kernel for it is not usable on this machine (see 'ds report')"

    def load(self, verbose: bool = True) -> Any:
        if self.NAME in OpBuilder._loaded_ops:
            return OpBuilder._loaded_ops[self.NAME]
        if not self.is_compatible(verbose):
            raise FeatureNotAvailableError(
                f"deepspeed op '{self.NAME}': {self._why()}; ds never compiles ops at run time"
            )
        module = importlib.import_module(self.MODULE)  # type: ignore[arg-type]
        OpBuilder._loaded_ops[self.NAME] = module
        return module

    def jit_load(self, verbose: bool = True) -> Any:
        return self.load(verbose)

    def builder(self) -> Any:
        raise FeatureNotAvailableError(
            f"deepspeed op '{self.NAME}': ds builds no extensions; its kernels are prebuilt "
            "with ds-ops-kernels"
        )


def probe_is_compatible(builder: OpBuilder) -> bool:
    try:
        return bool(builder.is_compatible())
    except Exception:
        return False


__all__ = ["OpBuilder", "get_default_compute_capabilities", "probe_is_compatible"]
