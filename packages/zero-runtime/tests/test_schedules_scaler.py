"""LR schedules against their closed forms, and the dynamic loss scaler's state machine."""

from __future__ import annotations

import math

import pytest
import torch

from ds.zero.loss_scaler import DynamicLossScaler, StageZeroLossScaler
from ds.zero.lr_schedules import LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR


def _opt(lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def _lrs(schedule, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(n):
        out.append(schedule.optimizer.param_groups[0]["lr"])
        schedule.step()
    return out


def test_warmup_lr_log_and_linear() -> None:
    log_sched = WarmupLR(_opt(), warmup_min_lr=0.0, warmup_max_lr=1.0, warmup_num_steps=10)
    got = _lrs(log_sched, 12)
    # DeepSpeed's counting: the floor before the first step, then iteration 0, 1, ...
    want = [0.0] + [math.log(i + 1) / math.log(10) for i in range(10)] + [1.0]
    assert got == pytest.approx(want)
    lin = WarmupLR(
        _opt(), warmup_min_lr=0.5, warmup_max_lr=1.5, warmup_num_steps=4, warmup_type="linear"
    )
    assert _lrs(lin, 6) == pytest.approx([0.5, 0.5, 0.75, 1.0, 1.25, 1.5])


def test_warmup_decay_reaches_zero_at_total() -> None:
    s = WarmupDecayLR(
        _opt(), total_num_steps=10, warmup_max_lr=1.0, warmup_num_steps=4, warmup_type="linear"
    )
    got = _lrs(s, 12)
    assert got[:5] == pytest.approx([0.0, 0.0, 0.25, 0.5, 0.75])
    assert got[5:] == pytest.approx([(10 - i) / 6 for i in range(4, 10)] + [0.0])


def test_warmup_cosine_scales_the_optimizer_lr() -> None:
    s = WarmupCosineLR(
        _opt(0.2), total_num_steps=12, warmup_num_steps=2, cos_min_ratio=0.1, warmup_type="linear"
    )
    got = _lrs(s, 13)
    assert got[:3] == pytest.approx([0.0, 0.0, 0.1])
    for i in range(3, 13):
        progress = min(1.0, (i - 2) / 10)  # step i runs iteration i - 1
        want = 0.2 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        assert got[i] == pytest.approx(want)


def test_one_cycle_lr_and_momentum() -> None:
    s = OneCycle(
        _opt(),
        cycle_min_lr=0.1,
        cycle_max_lr=1.0,
        cycle_first_step_size=4,
        decay_lr_rate=0.5,
        decay_step_size=2,
        cycle_min_mom=0.8,
        cycle_max_mom=0.9,
    )
    lrs, moms = [], []
    for _ in range(12):
        lrs.append(s.optimizer.param_groups[0]["lr"])
        moms.append(s.optimizer.param_groups[0]["betas"][0])
        s.step()
    assert lrs[:9] == pytest.approx([0.1, 0.325, 0.55, 0.775, 1.0, 0.775, 0.55, 0.325, 0.1])
    assert lrs[9:] == pytest.approx([0.1 / (1 + 0.5 * k / 2) for k in (1, 2, 3)])
    # Before the first step DeepSpeed sets cycle_min_mom; then momentum falls as the LR rises.
    assert moms[:5] == pytest.approx([0.8, 0.875, 0.85, 0.825, 0.8])


def test_lr_range_test_continuous_and_staircase() -> None:
    s = LRRangeTest(
        _opt(), lr_range_test_min_lr=0.01, lr_range_test_step_size=2, lr_range_test_step_rate=1.0
    )
    assert _lrs(s, 4) == pytest.approx([0.01, 0.015, 0.02, 0.025])
    st = LRRangeTest(
        _opt(),
        lr_range_test_min_lr=0.01,
        lr_range_test_step_size=2,
        lr_range_test_step_rate=1.0,
        lr_range_test_staircase=True,
    )
    assert _lrs(st, 4) == pytest.approx([0.01, 0.01, 0.02, 0.02])


def test_schedule_state_round_trips() -> None:
    a = WarmupLR(_opt(), warmup_max_lr=1.0, warmup_num_steps=10)
    for _ in range(5):
        a.step()
    b = WarmupLR(_opt(), warmup_max_lr=1.0, warmup_num_steps=10)
    b.load_state_dict(a.state_dict())
    assert b.get_last_lr() == a.get_last_lr()


def test_dynamic_scaler_hysteresis_and_growth() -> None:
    s = DynamicLossScaler(init_scale=2.0**8, scale_window=3, hysteresis=2, min_scale=1.0)
    s.update(True)  # first overflow is absorbed by hysteresis
    assert s.loss_scale == 256.0
    s.update(True)  # second one halves
    assert s.loss_scale == 128.0
    for _ in range(3):
        s.update(False)
    assert s.loss_scale == 256.0  # a clean window doubles it again
    floor = DynamicLossScaler(init_scale=2.0, hysteresis=1, min_scale=1.0)
    for _ in range(4):
        floor.update(True)
    assert floor.loss_scale == 1.0


def test_stage_zero_scaler_halves_at_once_and_grows_a_step_later() -> None:
    # DeepSpeed's unpartitioned fp16 rules: no hysteresis; growth after the window of clean
    # steps that follow the step after an overflow.
    s = StageZeroLossScaler(init_scale=2.0**8, scale_window=2, hysteresis=2, min_scale=1.0)
    assert s.dynamic_loss_scale
    scales = []
    for overflow in (True, True, False, False, False, False, True):
        s.update(overflow)
        scales.append(s.loss_scale)
    assert scales == [128.0, 64.0, 64.0, 64.0, 128.0, 128.0, 64.0] and s.cur_iter == 7


def test_schedules_refuse_an_lr_that_is_not_finite_and_nonnegative() -> None:
    from ds.interfaces.errors import ConfigError

    # NaN from the JSON is refused where the schedule first computes an LR (its constructor).
    with pytest.raises(ConfigError, match=r"WarmupLR computed lr = nan .* iteration -1"):
        WarmupLR(_opt(), warmup_min_lr=math.nan)
    # inf * gamma(0) = inf * 0 is NaN: refused at construction as well.
    with pytest.raises(ConfigError, match=r"computed lr = nan"):
        WarmupLR(_opt(), warmup_max_lr=math.inf)
    # Reached only at a later step (here the ceiling changed after construction): the groups
    # keep their last good LR.
    sched = WarmupLR(_opt(), warmup_min_lr=0.0, warmup_max_lr=1.0, warmup_num_steps=4)
    sched.max_lrs = [math.inf]
    assert sched.optimizer.param_groups[0]["lr"] == 0.0
    with pytest.raises(ConfigError, match=r"computed lr = nan for param group 0 at iteration 0"):
        sched.step()
    assert sched.optimizer.param_groups[0]["lr"] == 0.0
    with pytest.raises(ConfigError, match=r"lr = -0\.5"):
        WarmupLR(_opt(), warmup_min_lr=-0.5)
