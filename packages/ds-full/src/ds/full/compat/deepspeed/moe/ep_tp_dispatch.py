"""``deepspeed.moe.ep_tp_dispatch``: routed assignments split over the tensor-parallel ranks that
share them, and put back (:mod:`ds.parallel.moe.tp_dispatch`), on ``deepspeed.comm``."""

from __future__ import annotations

from typing import Any

import torch

from ds.full.compat.deepspeed import comm as dist
from ds.parallel.moe import tp_dispatch as _tp
from ds.parallel.moe.tp_dispatch import RestoreContext as RestoreContext
from ds.parallel.moe.tp_dispatch import RoutedAssignmentPayload as RoutedAssignmentPayload
from ds.parallel.moe.tp_dispatch import (
    assignment_ordinals_by_expert as assignment_ordinals_by_expert,
)
from ds.parallel.moe.tp_dispatch import dispatch_counters as dispatch_counters
from ds.parallel.moe.tp_dispatch import partition_assignments as partition_assignments


def restore_combined(
    local_combined: torch.Tensor,
    ctx: RestoreContext,
    *,
    tp_group: Any,
    validate_coverage: bool = False,
) -> torch.Tensor:
    return _tp.restore_combined(
        local_combined, ctx, comm=dist, tp_group=tp_group, validate_coverage=validate_coverage
    )


def assert_tp_payload_consistent(
    payload: RoutedAssignmentPayload, *, tp_group: Any, tp_size: int
) -> None:
    _tp.assert_tp_payload_consistent(payload, comm=dist, tp_group=tp_group, tp_size=tp_size)


# The owner's names: its collectives are bound to ``deepspeed.comm`` above, the rest re-exported.
__all__ = list(_tp.__all__)
