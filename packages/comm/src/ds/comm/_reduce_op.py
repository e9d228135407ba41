"""Translate the reduction operators users pass into the ones torch.distributed accepts.

Both ``ds.interfaces.comm.ReduceOp`` (the Protocol's enum) and ``torch.distributed.ReduceOp`` are
accepted, so code written against either keeps working after ``from ds import comm as dist``.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as _dist

from ds.interfaces.comm import ReduceOp
from ds.interfaces.errors import CommError

_TORCH = {
    ReduceOp.SUM: _dist.ReduceOp.SUM,
    ReduceOp.AVG: _dist.ReduceOp.AVG,
    ReduceOp.PRODUCT: _dist.ReduceOp.PRODUCT,
    ReduceOp.MIN: _dist.ReduceOp.MIN,
    ReduceOp.MAX: _dist.ReduceOp.MAX,
    ReduceOp.BAND: _dist.ReduceOp.BAND,
    ReduceOp.BOR: _dist.ReduceOp.BOR,
    ReduceOp.BXOR: _dist.ReduceOp.BXOR,
}
_BY_NAME = {op.value: t for op, t in _TORCH.items()}
_AVG = _dist.ReduceOp.AVG


def to_torch_op(op: Any) -> Any:
    """Return the ``torch.distributed.ReduceOp`` for ``op`` (ds enum, torch enum or name)."""
    t = _TORCH.get(op) if isinstance(op, ReduceOp) else None
    if t is not None:
        return t
    if isinstance(op, (_dist.ReduceOp, _dist.ReduceOp.RedOpType)):
        return op
    if isinstance(op, str) and op.lower() in _BY_NAME:
        return _BY_NAME[op.lower()]
    raise CommError(
        f"unknown reduction operator {op!r}; pass ds.comm.ReduceOp.<NAME> "
        f"(one of {', '.join(o.name for o in ReduceOp)}) or torch.distributed.ReduceOp.<NAME>"
    )


def is_avg(torch_op: Any) -> bool:
    return bool(torch_op == _AVG)
