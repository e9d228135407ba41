"""``engine.tput_timer``: DeepSpeed's samples-per-second timer, driven by forward and step()."""

from __future__ import annotations

import itertools

import pytest
import torch

from ds.zero import throughput
from ds.zero.engine import ZeroEngine


def _engine(**cfg: object) -> ZeroEngine:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    config = {
        "train_micro_batch_size_per_gpu": 3,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        **cfg,
    }
    return ZeroEngine(model, config)


def _train(engine: ZeroEngine, windows: int) -> None:
    for _ in range(windows * 2):
        engine.backward(engine(torch.randn(3, 4)).pow(2).mean())
        engine.step()


def test_engine_counts_and_times_after_the_warm_up() -> None:
    engine = _engine()
    timer = engine.tput_timer
    clock = itertools.count(start=100.0, step=0.5)  # every reading half a second later
    timer.clock = lambda: next(clock)
    assert timer.batch_size == 6 and timer.start_step == 2 and not timer.initialized
    assert timer.avg_samples_per_sec() == float("-inf")
    _train(engine, 2)  # the warm-up windows: counted, not timed
    assert (timer.micro_step_count, timer.global_step_count) == (4, 2)
    assert timer.total_elapsed_time == 0 and timer.avg_samples_per_sec() == float("-inf")
    _train(engine, 3)
    assert (timer.micro_step_count, timer.global_step_count) == (10, 5)
    # Each forward-to-step interval reads the clock twice: 0.5 s; 2 per window, 3 windows.
    assert timer.total_elapsed_time == pytest.approx(3.0)
    assert timer.avg_samples_per_sec() == pytest.approx(6 / 1.0)
    assert timer.step_elapsed_time == 0 and not timer.started


def test_disabled_timer_counts_nothing() -> None:
    engine = _engine(timers={"throughput": {"enabled": False}})
    _train(engine, 1)
    assert engine.tput_timer.micro_step_count == 0 and not engine.tput_timer.initialized


def test_synchronizes_once_per_window_not_per_micro_step() -> None:
    waits = []
    timer = throughput.ThroughputTimer(4, synchronize=lambda: waits.append(1), start_step=0)
    timer.stop()  # nothing started: no effect
    assert not timer.initialized and timer.micro_step_count == 0
    for k in range(6):
        timer.start()
        timer.stop(global_step=k % 3 == 2)
    assert (timer.micro_step_count, timer.global_step_count, len(waits)) == (6, 2, 2)
