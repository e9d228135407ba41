"""Stage 3 under ``torch.utils.checkpoint(use_reentrant=False)``: the recompute reads whole
parameters (torch compares them with the forward's and backward reads them after it), an
early-stopped recompute or an exception in forward, recompute or backward leaves no state behind
for the next step, and a parameter a module hands back to its caller is whole at the recompute.
Every case trains next to plain PyTorch on the same data: parameters equal to 1e-6."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from _stage3 import stage3
from test_stage3_external_access import AddsReturnedBias
from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from ds.zero.stage3.shard import ParamStatus

pytestmark = pytest.mark.timeout(60)


class Frozen(nn.Module):
    """A frozen linear, then a trained one, inside one checkpointed region (a LoRA-like block)."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(8, 8).requires_grad_(False)
        self.trained = nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)
        self.fail: str | None = None  # "forward", "recompute" or "backward": raise there once

    def _block(self, x: torch.Tensor) -> torch.Tensor:
        in_backward = torch._C._current_graph_task_id() != -1
        y = torch.sin(self.frozen(x))
        if self.fail == ("recompute" if in_backward else "forward"):
            self.fail = None
            raise RuntimeError("injected")
        y = self.trained(y)
        if self.fail == "backward":
            y = _RaiseInBackward.apply(y, self)
        torch.cos(y.detach())  # after the last saved tensor: an early stop ends here
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self._block, x, use_reentrant=False)).sum()


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y: torch.Tensor, owner: Frozen) -> torch.Tensor:  # type: ignore[override]
        ctx.owner = owner
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        ctx.owner.fail = None
        raise RuntimeError("injected")


class External(AddsReturnedBias):
    """The caller adds a bias its child hands back, inside the checkpointed region."""

    def _block(self, x: torch.Tensor) -> torch.Tensor:
        y, bias = self.inner(x)
        return torch.tanh(y + bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self._block, x, use_reentrant=False)).sum()


def _train(make: Callable[[], nn.Module], fail_at: dict[int, str], dim: int = 8) -> None:
    """Three steps of ds stage 3 and of plain PyTorch; at step ``i`` in ``fail_at`` both
    first run a backward that raises where the key says, then the retry."""
    torch.manual_seed(0)
    ref = make()
    model = copy.deepcopy(ref)
    ref_opt = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=0.1)
    eng = stage3(
        model,
        torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1),
        stage3_param_persistence_threshold=0,
        stage3_prefetch_bucket_size=0,
        stage3_max_reuse_distance=0,
    )
    for step in range(3):
        x = torch.randn(4, dim, generator=torch.Generator().manual_seed(step), requires_grad=True)
        x_ref = x.detach().clone().requires_grad_(True)
        if step in fail_at:
            ref.fail = model.fail = fail_at[step]  # type: ignore[assignment]
            with pytest.raises(RuntimeError, match="injected"):
                ref(x_ref).backward()
            with pytest.raises(RuntimeError, match="injected"):
                eng.backward(eng(x))
        ref_opt.zero_grad()  # the aborted backward's partial gradients are dropped on both sides
        eng.zero_grad()
        x_ref.grad = x.grad = None
        ref(x_ref).backward()
        eng.backward(eng(x))
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-6, atol=1e-6)
        ref_opt.step()
        eng.step()
        part = eng.strategy.partitioner
        assert not part._live and not any(part._in_use.values()) and not part._running
        assert all(shard_of_status(p) is ParamStatus.NOT_AVAILABLE for p in part.params)
    with eng.strategy.partitioner.hold():
        for a, b in zip(ref.parameters(), model.parameters()):
            torch.testing.assert_close(b.data, a.data, rtol=1e-6, atol=1e-6)


def shard_of_status(p: torch.Tensor) -> ParamStatus:
    return p.ds_shard.status  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize("early_stop", [True, False])
def test_recompute_reads_whole_parameters(early_stop: bool) -> None:
    with set_checkpoint_early_stop(early_stop):
        _train(Frozen, {})


@pytest.mark.parametrize("where", ["forward", "recompute", "backward"])
def test_exception_then_clean_retry(where: str) -> None:
    _train(Frozen, {1: where})


def test_returned_parameter_is_whole_at_recompute() -> None:
    _train(External, {}, dim=4)
