"""``checkpoint(function, *args)``: run a segment without keeping its activations; recompute
them in backward. Randomness (dropout) is replayed exactly by restoring the RNG state."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ds.zero.activation_checkpointing import settings as _settings
from ds.zero.activation_checkpointing.stash import POOL, Stashed, stash, unstash

_counter = {"forward": 0, "pending": 0}


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


class _Checkpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, run: Callable[..., Any], anchor: torch.Tensor, *args: Any) -> Any:  # type: ignore[override]
        s = _settings.current()
        ctx.run = run
        ctx.settings = s
        ctx.rng = _rng_state()
        slot = _counter["forward"]
        _counter["forward"] += 1
        _counter["pending"] += 1
        ctx.slot = slot
        with torch.no_grad():
            out = run(*args)
        ctx.inputs = [stash(a, s, slot) if isinstance(a, torch.Tensor) else a for a in args]
        ctx.single = isinstance(out, torch.Tensor)
        return out

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:  # type: ignore[override]
        s = ctx.settings
        inputs = [unstash(a, s) if isinstance(a, Stashed) else a for a in ctx.inputs]
        ctx.inputs = None
        _counter["pending"] -= 1
        if _counter["pending"] == 0:
            _counter["forward"] = 0
            for slot in list(POOL.cursor):
                POOL.reset(slot)
        here = _rng_state()
        _set_rng_state(ctx.rng)
        try:
            with torch.enable_grad():
                out = ctx.run(*inputs)
        finally:
            _set_rng_state(here)
        outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
        pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad and g is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None) + tuple(
            a.grad if isinstance(a, torch.Tensor) and a.requires_grad else None for a in inputs
        )


def checkpoint(function: Callable[..., Any], *args: Any) -> Any:
    """Run ``function(*args)`` without saving its intermediate activations; they are recomputed
    during backward. Outputs are a tensor or a tuple of tensors. How the inputs are kept meanwhile
    follows :func:`ds.zero.activation_checkpointing.configure` (partitioned, on CPU, contiguous)."""
    if not torch.is_grad_enabled():
        return function(*args)
    # The anchor requires grad so the outputs are part of the graph even when no input is (the
    # segment's parameters are not inputs of the autograd function).
    return _Checkpoint.apply(function, _anchor(), *args)


def _anchor() -> torch.Tensor:
    return torch.empty(0, requires_grad=True)


def reset() -> None:
    """Forget per-step bookkeeping (after an interrupted backward)."""
    _counter["forward"] = 0
    _counter["pending"] = 0
    for slot in list(POOL.cursor):
        POOL.reset(slot)
