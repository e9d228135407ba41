"""Stage 3 finds parameters a forward reads from another module as they are read: the first
step gathers them there, later steps fetch them with the reading module, and the gradients equal
the unpartitioned model's."""

from __future__ import annotations

import copy
from typing import Any

import torch
from _stage3 import stage3
from torch import nn

from ds.zero.stage3 import ParamStatus, shard_of
from ds.zero.stage3.external_access import ZeroParamDict, ensure_param_dict


class ReadsOther(nn.Module):
    def __init__(self, d: int = 6) -> None:
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.b(self.a(x))
        return nn.functional.linear(h, self.a.weight).sum()  # a's weight, after a released it


def _matches_torch(model: nn.Module, steps: int, make_x: Any) -> None:
    """Train ``model`` under stage 3 and a copy with plain torch on the same batches; the
    losses must agree step by step."""
    torch.manual_seed(0)
    ref = copy.deepcopy(model)
    eng = stage3(
        model, torch.optim.SGD(model.parameters(), lr=0.1), stage3_param_persistence_threshold=0
    )
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(steps):
        x = make_x()
        loss = eng(x)
        eng.backward(loss)
        eng.step()
        ref_opt.zero_grad()
        want = ref(x)
        want.backward()
        ref_opt.step()
        torch.testing.assert_close(loss, want)


def test_forward_reading_another_modules_weight() -> None:
    torch.manual_seed(0)
    model = ReadsOther()
    _matches_torch(model, 3, lambda: torch.randn(2, 6))
    assert all(shard_of(p).status is ParamStatus.NOT_AVAILABLE for p in model.parameters())
    assert isinstance(model.a._parameters, ZeroParamDict)


def test_param_dict_conversion_keeps_the_original() -> None:
    lin = nn.Linear(2, 2)
    first = lin._parameters
    ensure_param_dict(lin)
    converted = lin._parameters
    ensure_param_dict(lin)
    assert lin._parameters is converted and lin._original_parameters is first
    assert list(converted) == ["weight", "bias"] and converted["weight"] is lin.weight
    ensure_param_dict(object())  # nothing to convert


class ReturnsBias(nn.Linear):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return nn.functional.linear(x, self.weight), self.bias


class AddsReturnedBias(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = ReturnsBias(4, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, bias = self.inner(x)
        return self.head(torch.tanh(out + bias)).sum()


def test_parameter_returned_by_a_module_stays_whole_for_its_caller() -> None:
    torch.manual_seed(0)
    _matches_torch(AddsReturnedBias(), 2, lambda: torch.randn(3, 4))


class PassesReturnedBias(nn.Module):
    """Hands on the bias its inner module returned: the caller two levels up adds it."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = ReturnsBias(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, bias = self.inner(x)
        return out, bias


class AddsBiasFromTwoLevelsDown(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.passes = PassesReturnedBias()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, bias = self.passes(self.first(x))
        return (torch.tanh(out) + bias).sum()


def test_parameter_returned_through_two_modules_reaches_the_caller_whole() -> None:
    torch.manual_seed(0)
    _matches_torch(AddsBiasFromTwoLevelsDown(), 3, lambda: torch.randn(3, 4))


class Delegates(nn.Module):
    """A wrapper whose unknown attributes are the wrapped module's (``__getattr__``): hooks
    bookkeeping kept in module attributes must not land on, or be read from, the wrong one."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.wrapped = module

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("wrapped"), name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wrapped(x)  # type: ignore[no-any-return]


class WithDelegatingWrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input = nn.Linear(4, 4)
        self.output = Delegates(nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.input(x)).sum()


def test_attribute_delegating_wrapper_trains_like_torch() -> None:
    torch.manual_seed(0)
    _matches_torch(WithDelegatingWrapper(), 3, lambda: torch.randn(2, 4))
