"""Bytes a stage 0-2 rank holds for training state, by construction (not measured)."""

from __future__ import annotations

import torch

from ds.zero.stages.base import MemoryReport
from ds.zero.stages.groups import Group


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def memory_report(
    groups: list[Group], optimizer: torch.optim.Optimizer, pool_bytes: int
) -> MemoryReport:
    report = MemoryReport()
    for group in groups:
        for k, v in optimizer.state.get(group.master, {}).items():
            if not isinstance(v, torch.Tensor):
                continue
            if v.numel() == group.master.numel():
                report.optimizer_state_bytes += _nbytes(v)
            else:  # scalars such as the step count
                report.details[f"optimizer_scalar.{k}"] = _nbytes(v)
        grads = 0 if group.master_grad_is_view else _nbytes(group.master_grad)
        if group.flat_grad is not None:
            grads += _nbytes(group.flat_grad)
        report.gradient_bytes += grads
        if not group.master_is_view:
            report.master_weight_bytes += _nbytes(group.master)
        report.parameter_bytes += _nbytes(group.flat.flat)
    report.details["reusable_comm_buffers"] = pool_bytes
    return report
