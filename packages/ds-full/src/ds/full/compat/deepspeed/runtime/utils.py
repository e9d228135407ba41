"""``deepspeed.runtime.utils``: the helpers integrations call."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ds.full.compat.deepspeed.runtime.partitioned_tensor import PartitionedTensor


def move_to_device(item: Any, device: Any, criterion_func: Any = None) -> Any:
    """Move the tensors inside nested lists, tuples and dicts to ``device`` (others unchanged).

    ``criterion_func(tensor)`` (optional) selects which tensors move, as in DeepSpeed."""
    if isinstance(item, torch.Tensor):
        if criterion_func is None or criterion_func(item):
            return item.to(device)
        return item
    if isinstance(item, list):
        return [move_to_device(v, device, criterion_func) for v in item]
    if isinstance(item, tuple):
        return tuple(move_to_device(v, device, criterion_func) for v in item)
    if isinstance(item, dict):
        return {k: move_to_device(v, device, criterion_func) for k, v in item.items()}
    return item


def set_random_seed(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (every device) with ``seed``
    (reduced modulo what each accepts: 2**32 for NumPy, 2**63 for torch)."""
    import random

    import numpy

    seed = int(seed)
    random.seed(seed)
    numpy.random.seed(seed % (2**32))
    torch.manual_seed(seed % (2**63))


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """Part bounds ``[0, ..., num_items]`` with equal counts (ds's pipeline partitioner)."""
    from ds.parallel.pipeline.partition import uniform

    return uniform(num_items, num_parts)


def prefix_sum_inc(weights: Sequence[Any]) -> list[Any]:
    """Inclusive running totals: ``[3, 4, 5]`` gives ``[3, 7, 12]``."""
    return list(itertools.accumulate(weights))


def partition_balanced(weights: Sequence[float], num_parts: int) -> list[int]:
    """Part bounds ``[0, ..., len(weights)]`` whose part totals are as even as possible, as
    DeepSpeed defines it: the smallest spread between the heaviest and the lightest part, every
    part holding at least one item (ties go to the later cut). With no more items than parts,
    the uniform bounds (one item a part, the rest empty)."""
    n = len(weights)
    if n <= num_parts:
        return partition_uniform(n, num_parts)
    prefix = [0, *itertools.accumulate(weights)]
    # best[j][i]: (spread, heaviest, lightest, last cut) splitting the first i items in j parts.
    best: list[dict[int, tuple[float, float, float, int]]] = [{0: (0, 0, math.inf, 0)}]
    for j in range(1, num_parts + 1):
        row: dict[int, tuple[float, float, float, int]] = {}
        for i in range(j, n - (num_parts - j) + 1):
            for k, (_, hi, lo, _) in best[j - 1].items():
                if k >= i:
                    continue
                part = prefix[i] - prefix[k]
                top, bottom = max(hi, part), min(lo, part)
                if i not in row or top - bottom <= row[i][0]:
                    row[i] = (top - bottom, top, bottom, k)
        best.append(row)
    bounds = [n]
    for j in range(num_parts, 0, -1):
        bounds.append(best[j][bounds[-1]][3])
    return bounds[::-1]


def count_used_parameters_in_backward(parameters: Iterable[Any]) -> int:
    """How many of ``parameters`` the running backward pass reaches (their gradient accumulators
    will run). Call it from a backward hook; outside a backward it raises RuntimeError."""
    from torch.autograd.graph import _get_grad_fn_or_grad_acc

    if torch._C._current_graph_task_id() == -1:
        raise RuntimeError("count_used_parameters_in_backward must be called during a backward")
    nodes = set()
    for p in parameters:
        if isinstance(p, torch.Tensor) and p.requires_grad:
            with torch.enable_grad():  # hooks run without grad mode; the lookup needs it
                node = _get_grad_fn_or_grad_acc(p)
            if node is not None:
                nodes.add(node)  # shared (tied) parameters count once
    return sum(1 for node in nodes if torch._C._will_engine_execute_node(node))


def is_model_parallel_parameter(p: Any) -> bool:
    """Whether ``p`` is one slice of a weight split over the model-parallel ranks: marked so by
    Megatron-style code (``model_parallel`` / ``tensor_model_parallel``) or sliced by ds's AutoTP."""
    from ds.interfaces.parallel import tp_dim

    marked = getattr(p, "model_parallel", False) or getattr(p, "tensor_model_parallel", False)
    return bool(marked) or tp_dim(p) is not None


def call_to_str(base: str, *args: Any, **kwargs: Any) -> str:
    """``"base(arg, key=value)"`` (DeepSpeed's rendering of a call in logs)."""
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{base}({', '.join(parts)})"


def see_memory_usage(message: str, force: bool = False) -> None:
    """DeepSpeed prints allocator statistics here; ds reports memory through ``ds report`` and
    the engine's ``memory_report()``, so this only logs the message when forced."""
    if force:
        from ds.interfaces.logging import get_logger

        get_logger(__name__).info("memory usage", message=message)


__all__ = [
    "PartitionedTensor",
    "call_to_str",
    "count_used_parameters_in_backward",
    "is_model_parallel_parameter",
    "move_to_device",
    "partition_balanced",
    "partition_uniform",
    "prefix_sum_inc",
    "see_memory_usage",
    "set_random_seed",
]
