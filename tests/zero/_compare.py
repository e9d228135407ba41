"""Relative-error helpers for parity tests."""

from __future__ import annotations

import torch


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def worst_weight_error(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]
) -> tuple[float, str]:
    assert got.keys() == want.keys()
    return max((rel(got[n], want[n]), n) for n in want)


def worst_loss_error(got: list[float], want: list[float]) -> float:
    assert len(got) == len(want)
    return max(abs(a - b) / abs(b) for a, b in zip(got, want))
