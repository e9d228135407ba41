"""``deepspeed.utils``: the logger, rank-aware logging, ZeRO-3 helpers and ``zero_to_fp32``."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch

from ds.full.compat.deepspeed._missing import FeatureNotAvailableError, missing_function
from ds.full.compat.deepspeed.runtime.dataloader import RepeatingLoader
from ds.full.compat.deepspeed.runtime.utils import set_random_seed
from ds.full.compat.deepspeed.utils.tensor_fragment import (
    safe_get_full_fp32_param,
    safe_get_full_optimizer_state,
    safe_get_local_fp32_param,
    safe_get_local_optimizer_state,
    safe_set_full_fp32_param,
    safe_set_full_optimizer_state,
    safe_set_local_fp32_param,
    safe_set_local_optimizer_state,
)

# DeepSpeed's module-level logger is a plain ``logging.Logger`` that scripts call .info/.warning on.
logger = logging.getLogger("ds.deepspeed_compat")


def log_dist(message: str, ranks: Iterable[int] | None = None, level: int = logging.INFO) -> None:
    """Log ``message`` on the listed ranks (all ranks when ``ranks`` contains -1; rank 0 when
    ``ranks`` is None, as DeepSpeed does)."""
    from ds import comm

    rank = comm.get_rank() if comm.is_initialized() else 0
    wanted = set(ranks) if ranks is not None else {0}
    if -1 in wanted or rank in wanted:
        logger.log(level, f"[Rank {rank}] {message}")


def set_z3_leaf_modules(model: torch.nn.Module, leaf_module_classes: list[Any]) -> list[Any]:
    """Mark modules whose parameters ZeRO-3 fetches as one unit. ds's ZeRO-3 fetches per module
    already, so this records the mark (``_z3_leaf``) and returns the marked modules."""
    classes = tuple(c for c in leaf_module_classes if isinstance(c, type))
    names = {c for c in leaf_module_classes if isinstance(c, str)}
    marked = []
    for m in model.modules():
        if isinstance(m, classes) or type(m).__name__ in names:
            m._z3_leaf = True  # type: ignore[assignment]
            marked.append(m)
    return marked


def z3_leaf_module(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "_z3_leaf", False))


def __getattr__(name: str) -> Any:
    if name in ("zero_to_fp32", "groups", "torch"):
        # import_module, not ``from . import``: a failing import then raises instead of
        # re-entering this hook.
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"deepspeed.utils.{name} has no ds equivalent")


def safe_get_full_grad(param: torch.nn.Parameter) -> torch.Tensor | None:
    """The whole gradient of ``param`` after backward, before step. ds keeps whole gradients on
    the parameters at ZeRO stages 0-1; at stages 2-3 they live in flat partitions, which this
    refuses to guess at."""
    grad = param.grad
    if grad is not None and grad.shape == param.shape:
        return grad.detach().clone()
    if grad is None and getattr(param, "ds_numel", None) is None and param.numel() > 0:
        return None  # no gradient yet (before backward, or frozen)
    raise FeatureNotAvailableError(
        "deepspeed.utils.safe_get_full_grad: at ZeRO stage 2/3 ds keeps gradients in flat "
        "partitions; read them at stage 0/1, or register a hook on the module's backward"
    )


safe_get_local_grad = missing_function(
    "deepspeed.utils.safe_get_local_grad", "reading a rank's gradient partition",
    "read whole gradients at ZeRO stage 0/1 with safe_get_full_grad",
)  # fmt: skip
safe_set_local_grad = missing_function(
    "deepspeed.utils.safe_set_local_grad", "writing a rank's gradient partition",
    "scale or replace gradients in a backward hook instead",
)  # fmt: skip
safe_update_full_grad_vectorized = missing_function(
    "deepspeed.utils.safe_update_full_grad_vectorized",
    "updating several parameters' gradients through the engine",
    "scale or replace gradients in a backward hook instead",
)  # fmt: skip
safe_set_full_grad = missing_function(
    "deepspeed.utils.safe_set_full_grad", "writing one parameter's gradient through the engine",
    "scale or replace gradients in a backward hook instead",
)  # fmt: skip

__all__ = [
    "RepeatingLoader",
    "log_dist",
    "logger",
    "safe_get_full_fp32_param",
    "safe_get_full_grad",
    "safe_get_full_optimizer_state",
    "safe_get_local_fp32_param",
    "safe_get_local_grad",
    "safe_get_local_optimizer_state",
    "safe_set_full_fp32_param",
    "safe_set_full_grad",
    "safe_set_full_optimizer_state",
    "safe_set_local_fp32_param",
    "safe_set_local_grad",
    "safe_set_local_optimizer_state",
    "safe_update_full_grad_vectorized",
    "set_random_seed",
    "set_z3_leaf_modules",
    "z3_leaf_module",
]
