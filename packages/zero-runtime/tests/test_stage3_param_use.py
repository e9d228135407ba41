"""Stage 3's record of who uses a parameter, under DeepSpeed's names (``ds_active_sub_modules``,
``is_external_param``), and a backward the engine did not start (``loss.backward()``,
``engine.scale(loss).backward()``): its end releases what backward gathered, and it trains as
plain PyTorch does."""

from __future__ import annotations

import copy

import pytest
import torch
from _stage3 import stage3
from test_stage3_external_access import AddsReturnedBias
from test_stage3_torch_checkpoint import Frozen

from ds.zero.engine import ZeroEngine
from ds.zero.stage3.shard import ParamStatus
from ds.zero.stages.reduction import DirectBackwardError

pytestmark = pytest.mark.timeout(60)

_ZERO = {
    "stage3_param_persistence_threshold": 0,
    "stage3_prefetch_bucket_size": 0,
    "stage3_max_reuse_distance": 0,
}


def test_direct_backward_releases_and_matches_torch() -> None:
    torch.manual_seed(0)
    ref = Frozen()
    model = copy.deepcopy(ref)
    ref_opt = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=0.1)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    eng = stage3(model, opt, **_ZERO)
    for step in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        ref_opt.zero_grad()
        ref(x).backward()
        ref_opt.step()
        eng(x).backward()  # not engine.backward: the end of the backward still cleans up
        assert all(p.ds_status is ParamStatus.NOT_AVAILABLE for p in model.parameters())
        assert not eng.strategy.partitioner._live
        eng.step()
    with eng.strategy.partitioner.hold():
        for a, b in zip(ref.parameters(), model.parameters()):
            torch.testing.assert_close(b.data, a.data, rtol=1e-6, atol=1e-6)


def test_active_sub_modules_follow_running_modules() -> None:
    model = AddsReturnedBias()
    # Held here: reading ``module.weight`` in a hook is a read stage 3 answers by gathering.
    inner_w, head_w = model.inner.weight, model.head.weight
    eng = stage3(model, torch.optim.SGD(model.parameters(), lr=0.1), **_ZERO)
    seen: dict[str, set[int]] = {}

    def record(m: torch.nn.Module, args: object, out: object) -> None:
        seen["inner"] = set(inner_w.ds_active_sub_modules)
        seen["head"] = set(head_w.ds_active_sub_modules)

    model.inner.register_forward_hook(record, prepend=True)  # before stage 3's post-hook
    loss = eng(torch.randn(3, 4)).sum()
    assert seen == {"inner": {id(model.inner)}, "head": set()}
    # The bias ``inner`` hands back is its caller's until the caller's forward ends.
    assert model.inner.bias.is_external_param and not model.inner.weight.is_external_param
    assert all(not p.ds_active_sub_modules for p in model.parameters())
    eng.backward(loss)
    eng.step()


def test_clearing_active_sub_modules_lets_a_parameter_go() -> None:
    model = AddsReturnedBias()
    eng = stage3(model, torch.optim.SGD(model.parameters(), lr=0.1), **_ZERO)
    part = eng.strategy.partitioner
    w = model.head.weight
    part._pre_forward(model.head, ())  # as if head's forward had been cut short
    assert id(model.head) in w.ds_active_sub_modules and len(w.ds_active_sub_modules) == 1
    part.release([w])
    assert w.ds_status is ParamStatus.AVAILABLE  # in use: kept
    w.ds_active_sub_modules.clear()
    assert not w.ds_active_sub_modules
    part.release([w])
    assert w.ds_status is ParamStatus.NOT_AVAILABLE


def test_scaled_direct_backward_accumulates_as_engine_backward() -> None:
    """Two micro-steps of ``engine.scale(loss).backward()`` (the loss scale and the division by
    the accumulation steps in the scaled loss) against plain PyTorch on the mean loss."""
    torch.manual_seed(0)
    ref = Frozen()
    model = copy.deepcopy(ref)
    ref_opt = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=0.1)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    eng = stage3(
        model, opt, config={"gradient_accumulation_steps": 2, "train_batch_size": 2}, **_ZERO
    )
    for step in range(2):
        xs = [
            torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * step + i))
            for i in (0, 1)
        ]
        ref_opt.zero_grad()
        (sum(ref(x) for x in xs) / 2).backward()
        ref_opt.step()
        for x in xs:
            eng.scale(eng(x)).backward()
            assert not eng.strategy.partitioner._live
            eng.step()
    with eng.strategy.partitioner.hold():
        for a, b in zip(ref.parameters(), model.parameters()):
            torch.testing.assert_close(b.data, a.data, rtol=1e-6, atol=1e-6)


def test_scale_is_refused_where_direct_backward_is() -> None:
    model = torch.nn.Linear(4, 1)
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True}
    eng = ZeroEngine(
        model,
        {**cfg, "zero_optimization": {"stage": 2}},
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
    )
    with pytest.raises(DirectBackwardError, match=r"engine\.backward\(loss\)"):
        eng.scale(eng(torch.randn(2, 4)).sum())
    with pytest.raises(ValueError, match="scalar"):
        eng.scale(eng(torch.randn(2, 4)))
