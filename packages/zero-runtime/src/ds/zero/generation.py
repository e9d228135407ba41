"""Generation under stage 3 with one gather per ``generate`` call, not one per token.

Token-by-token decoding calls every module once per token; with per-module gather/release that is
a full-model all-gather for every token. ``gathered_for_generation`` gathers every parameter in one
collective, switches the per-module hooks off for the duration, and releases everything at exit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ds.zero.init import GatheredParameters
from ds.zero.stage3.partitioner import Stage3Partitioner


def _partitioner(module: torch.nn.Module) -> Stage3Partitioner | None:
    part = module.__dict__.get("_ds_stage3")
    return part if isinstance(part, Stage3Partitioner) else None


@contextmanager
def gathered_for_generation(module: torch.nn.Module) -> Iterator[None]:
    """Inside the block every parameter of ``module`` is whole and stays whole. Every rank must
    enter it (it gathers). Peak memory is the full model's parameters for the duration."""
    part = _partitioner(module)
    if part is None:  # built under ds.zero.Init but not (yet) handed to an engine
        with GatheredParameters(list(module.parameters())):
            yield
        return
    with part.hold():
        yield


def generate(
    module: torch.nn.Module, *args: Any, fn: Callable[..., Any] | None = None, **kwargs: Any
) -> Any:
    """``module.generate(*args, **kwargs)`` (or ``fn(*args, **kwargs)``) with parameters gathered
    once for the whole call."""
    call = fn if fn is not None else module.generate  # type: ignore[operator]
    with torch.no_grad(), gathered_for_generation(module):
        return call(*args, **kwargs)
