"""``engine.tput_timer`` on simulated GPUs: no host sync unless the config asks for one."""

from __future__ import annotations

import pytest
from _world import config, device_syncs, train

pytestmark = [pytest.mark.simgpu, pytest.mark.slow]


def _timer_syncs(cfg: dict) -> list:
    # 4 optimizer steps: the timer's 2 warm-up steps, then 2 timed ones.
    result = train(cfg, steps=4, world=2)
    return [s for s in device_syncs(result) if "accelerator.synchronize()" in s.where]


def test_default_timer_adds_no_host_sync() -> None:
    assert _timer_syncs(config(2, "bf16")) == []


def test_synchronized_timer_waits_once_per_timed_step() -> None:
    cfg = config(2, "bf16")
    cfg["timers"] = {"throughput": {"synchronized": True}}
    assert len(_timer_syncs(cfg)) == 2
