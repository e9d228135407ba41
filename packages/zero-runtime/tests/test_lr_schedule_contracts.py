"""LR schedule contracts: values against float64 re-computations of each formula, tensor LRs
filled in place, per-group bounds, the momentum/ratio accessors, and refused parameters."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from ds.interfaces.errors import ConfigError
from ds.zero.config import load_config
from ds.zero.lr_schedules import (
    LRRangeTest,
    OneCycle,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
    build_schedule,
)


def _log_gamma(it: int, n: int) -> float:
    return 1.0 if it >= n else math.log(it + 1) / math.log(n)


def _cycle_frac(it: int, first: int, second: int) -> float | None:
    if it >= first + second:
        return None
    return it / first if it < first else (first + second - it) / second


def _adam(*lrs: float) -> torch.optim.Optimizer:
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in lrs]
    return torch.optim.Adam(groups, betas=(0.9, 0.999))


def _sgd_tensor_lr(shape: tuple[int, ...]) -> tuple[torch.optim.Optimizer, torch.Tensor]:
    lr = torch.full(shape, 0.1, dtype=torch.float64)
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr), lr


# (schedule, kwargs, LR after construction, LR after step(it) for it = 1..5), float64 formulas
TENSOR_CASES = [
    (WarmupLR, {"warmup_num_steps": 4}, lambda it: 0.1 * _log_gamma(it, 4)),
    (
        WarmupDecayLR,
        {"total_num_steps": 5, "warmup_num_steps": 2, "warmup_max_lr": 0.2},
        lambda it: 0.2 * (_log_gamma(it, 2) if it < 2 else max(0.0, (5 - it) / 3)),
    ),
    (
        WarmupCosineLR,
        {"total_num_steps": 4, "warmup_num_steps": 2, "cos_min_ratio": 0.1},
        lambda it: (
            0.1
            * (
                _log_gamma(it, 2)
                if it < 2
                else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (it - 1) / 2)))
            )
        ),
    ),
    (
        OneCycle,
        {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": 3},
        lambda it: 0.01 + 0.09 * (_cycle_frac(it + 1, 3, 3) or 0.0),
    ),
    (
        LRRangeTest,
        {"lr_range_test_min_lr": 0.02, "lr_range_test_step_size": 2},
        lambda it: 0.02 * (1 + (it + 1) / 2),
    ),
]


@pytest.mark.parametrize("shape", [(), (1,)])
@pytest.mark.parametrize(
    "cls, kwargs, want", TENSOR_CASES, ids=lambda c: getattr(c, "__name__", "")
)
def test_tensor_lr_is_filled_in_place(cls, kwargs, want, shape) -> None:  # type: ignore[no-untyped-def]
    opt, lr = _sgd_tensor_lr(shape)
    sched = cls(opt, **kwargs)
    first = 0.0 if cls is WarmupCosineLR else want(-1 if cls in (OneCycle, LRRangeTest) else 0)
    assert opt.param_groups[0]["lr"] is lr and lr.shape == shape and lr.dtype == torch.float64
    assert lr.item() == pytest.approx(first, rel=1e-12, abs=1e-15)
    for it in range(1, 6):
        sched.step(it)
        assert opt.param_groups[0]["lr"] is lr and lr.shape == shape
        assert lr.item() == pytest.approx(want(it), rel=1e-12, abs=1e-15)
    assert sched.get_last_lr()[0] is lr


def test_tensor_lr_trains_with_the_scheduled_value() -> None:
    opt, lr = _sgd_tensor_lr(())
    sched = LRRangeTest(opt, lr_range_test_min_lr=0.5, lr_range_test_step_size=1)
    sched.step()  # lr = 0.5 * (1 + 1): the LR of iteration 1
    p = opt.param_groups[0]["params"][0]
    p.grad = torch.ones(1)
    opt.step()
    assert p.item() == pytest.approx(-1.0) and lr.item() == pytest.approx(1.0)


def test_one_cycle_per_group_bounds_and_momentum() -> None:
    opt = _adam(0.1, 0.2)
    lo, hi, mlo, mhi = [0.001, 0.002], [0.01, 0.03], [0.8, 0.85], [0.9, 0.95]
    bounds = {"cycle_min_lr": lo, "cycle_max_lr": hi, "cycle_min_mom": mlo, "cycle_max_mom": mhi}
    steps = {"cycle_first_step_size": 3, "cycle_second_step_size": 5, "decay_step_size": 2}
    sched = OneCycle(opt, decay_lr_rate=0.5, decay_mom_rate=0.1, **bounds, **steps)
    assert sched.min_lrs == lo and sched.max_lrs == hi and sched.step_ratio == 3 / 8
    assert [g["betas"][0] for g in opt.param_groups] == mlo  # DeepSpeed's state before step 1
    for it in range(-1, 14):
        if it >= 0:
            sched.step()
        nxt = it + 1
        frac = _cycle_frac(nxt, 3, 5)
        if frac is None:
            k = (nxt - 8) / 2
            lrs = [a / (1 + 0.5 * k) for a in lo]
            moms = [b * (1 + 0.1 * k) for b in mhi]
        else:
            lrs = [a + (b - a) * frac for a, b in zip(lo, hi)]
            moms = [b - (b - a) * frac for a, b in zip(mlo, mhi)]
        assert sched.get_lr() == pytest.approx(lrs, rel=1e-12)
        assert [m for m, _ in sched.get_mom()] == pytest.approx(moms, rel=1e-12)
        assert [b2 for _, b2 in sched.get_mom()] == [0.999, 0.999]  # the optimizer's own beta2
        if it >= 0:
            assert [g["lr"] for g in opt.param_groups] == pytest.approx(lrs, rel=1e-12)
            assert [g["betas"][0] for g in opt.param_groups] == pytest.approx(moms, rel=1e-12)


def test_one_cycle_without_betas_has_no_momentum_and_zero_second_half_ramps() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.9)
    sched = OneCycle(opt, cycle_min_lr=0.001, cycle_max_lr=0.1, cycle_first_step_size=4,
                     cycle_second_step_size=0)  # fmt: skip
    assert sched.get_mom() is None and sched.step_ratio == 1.0
    lrs = [sched.get_lr()[0]]
    for _ in range(5):
        sched.step()
        lrs.append(sched.get_lr()[0])
    want = [0.001 + 0.099 * i / 4 for i in range(4)] + [0.001, 0.001]
    assert lrs == pytest.approx(want, rel=1e-12)


def test_one_cycle_stairs_keep_exact_boundaries_of_an_asymmetric_cycle() -> None:
    opt = _adam(0.1)
    kw = {"cycle_min_lr": 0.0, "cycle_max_lr": 1.0, "cycle_first_step_size": 10}
    stairs = OneCycle(opt, cycle_first_stair_count=10, cycle_second_step_size=21,
                      cycle_second_stair_count=21, **kw)  # fmt: skip
    smooth = OneCycle(_adam(0.1), cycle_second_step_size=21, **kw)
    for it in range(31):
        assert stairs.lr_at(it) == smooth.lr_at(it)
    coarse = OneCycle(_adam(0.1), cycle_first_stair_count=2, cycle_second_step_size=21, **kw)
    assert [coarse.lr_at(i)[0] for i in range(10)] == [0.0] * 5 + [0.5] * 5


@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_cosine_ratio_matches_the_formula(kind: str) -> None:
    opt = _adam(0.004, 0.002)
    sched = WarmupCosineLR(opt, total_num_steps=12, warmup_num_steps=5, warmup_min_ratio=0.2,
                           cos_min_ratio=0.05, warmup_type=kind)  # fmt: skip
    assert sched.get_lr_ratio() == 0.0 and sched.get_lr() == [0.0, 0.0]
    for it in range(20):
        sched.step(it)
        if it < 5:
            g = _log_gamma(it, 5) if kind == "log" else it / 5
            want = 0.2 + 0.8 * g
        else:
            want = 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, (it - 4) / 7)))
        assert sched.get_lr_ratio() == pytest.approx(want, rel=1e-12)
        assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.004 * want, 0.002 * want])


def test_warmup_cosine_with_no_decay_window_holds_the_floor() -> None:
    sched = WarmupCosineLR(_adam(0.01), total_num_steps=6, warmup_num_steps=6, cos_min_ratio=0.1)
    for it in range(6, 12):
        sched.step(it)
        assert sched.get_lr_ratio() == pytest.approx(0.1)


def test_unknown_warmup_type_warns_and_uses_log() -> None:
    for cls, extra in ((WarmupLR, {}), (WarmupCosineLR, {"total_num_steps": 20})):
        with pytest.warns(UserWarning, match="unknown warmup_type 'cubic'"):
            odd = cls(_adam(0.01), warmup_num_steps=8, warmup_type="cubic", **extra)
        ref = cls(_adam(0.01), warmup_num_steps=8, warmup_type="log", **extra)
        assert odd.warmup_type == "log"
        for it in range(10):
            odd.step(it)
            ref.step(it)
            assert odd.get_lr() == ref.get_lr()


def test_warmup_lr_per_group_bounds() -> None:
    opt = _adam(0.1, 0.2)
    sched = WarmupLR(opt, warmup_min_lr=[0.01, 0.0], warmup_num_steps=4, warmup_type="linear")
    assert sched.max_lrs == [0.1, 0.2]
    sched.step(2)
    assert sched.get_lr() == pytest.approx([0.01 + 0.09 * 0.5, 0.1], rel=1e-12)


@pytest.mark.parametrize("bad", [None, -5, 0, 2.5, "10"])
@pytest.mark.parametrize("cls", [WarmupLR, WarmupDecayLR, WarmupCosineLR])
def test_warmup_schedules_refuse_bad_warmup_num_steps(cls, bad) -> None:  # type: ignore[no-untyped-def]
    opt = _adam(0.01)
    extra = {} if cls is WarmupLR else {"total_num_steps": 100}
    with pytest.raises(ConfigError, match="warmup_num_steps must be a positive whole number"):
        cls(opt, warmup_num_steps=bad, **extra)
    assert opt.param_groups[0]["lr"] == 0.01  # refused before touching the optimizer


def test_a_whole_float_step_count_is_accepted() -> None:
    assert WarmupLR(_adam(0.01), warmup_num_steps=10.0).warmup_num_steps == 10


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"cycle_first_step_size": 0}, "cycle_first_step_size"),
        ({"cycle_first_step_size": -1}, "cycle_first_step_size"),
        ({"cycle_first_step_size": 0, "cycle_second_step_size": 100}, "cycle_first_step_size"),
        ({"cycle_first_step_size": 100, "cycle_second_step_size": -1}, "cycle_second_step_size"),
        ({"cycle_min_lr": [0.1, 0.2, 0.3]}, "cycle_min_lr has 3 values"),
        ({"cycle_max_mom": [0.9]}, "cycle_max_mom has 1 values"),
    ],
)
def test_one_cycle_refuses_bad_parameters(kwargs, name) -> None:  # type: ignore[no-untyped-def]
    base = {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01, "cycle_first_step_size": 5}
    with pytest.raises(ConfigError, match=name):
        OneCycle(_adam(0.1, 0.2), **{**base, **kwargs})


@pytest.mark.parametrize("bad", [0, -5])
def test_lr_range_test_refuses_a_nonpositive_step_size(bad: int) -> None:
    with pytest.raises(ConfigError, match="lr_range_test_step_size"):
        LRRangeTest(_adam(0.1), lr_range_test_step_size=bad)
    with pytest.raises(ConfigError, match="lr_range_test_min_lr has 1 values"):
        LRRangeTest(_adam(0.1, 0.2), lr_range_test_min_lr=[0.1])


def test_lr_range_test_per_group_min_lr() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sched = LRRangeTest(_adam(0.1, 0.2), lr_range_test_min_lr=[0.01, 0.02],
                            lr_range_test_step_size=4, lr_range_test_step_rate=2.0)  # fmt: skip
    sched.step(2)
    assert sched.get_lr() == pytest.approx([0.01 * (1 + 2 * 3 / 4), 0.02 * (1 + 2 * 3 / 4)])


def _config(params: dict[str, object]) -> dict[str, object]:
    return {"train_batch_size": 2, "scheduler": {"type": "OneCycle", "params": params}}


def test_config_per_group_lists_reach_the_schedule() -> None:
    params = {"cycle_min_lr": [0.001, 0.002], "cycle_max_lr": [0.01, 0.02], "cycle_max_mom": 0.95}
    section = load_config(_config(params)).scheduler
    assert section is not None
    sched = build_schedule(section.type, _adam(0.1, 0.2), section.resolved_params())
    assert sched.get_lr() == [0.001, 0.002] and sched.max_lrs == [0.01, 0.02]


@pytest.mark.parametrize(
    "params, match",
    [
        ({"cycle_min_lr": ["0.1"], "cycle_max_lr": 0.1}, "must be a number or a list of numbers"),
        ({"cycle_min_lr": 0.1, "cycle_max_lr": 0.2, "decay_lr_rate": [0.1]}, "a list is taken"),
    ],
)
def test_config_refuses_lists_a_schedule_cannot_take(params, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=match):
        load_config(_config(params))
