"""What the simulation holds the code to beyond placement: its own device selection, host syncs
that include blocking copies to the host, and device work that completes only when waited for.

Each rule has a case on ds's own code that fails when the code breaks it: a rank that never calls
``set_device(local_rank)`` fails its first collective; a ``.cpu()`` of a device tensor is a host
sync; reading a non-blocking loss copy, or an ``elapsed_time``, before the wait raises.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _world import DIM, MLP, config, device_syncs

import ds.full as ds
from ds.interfaces.errors import AcceleratorError, CommError
from ds.sim.accelerator import SimDevice, SimGpuAccelerator
from ds.sim.world import RankContext, run_world

pytestmark = pytest.mark.simgpu


def _train_body(cfg: dict[str, Any], *, host_copy_per_micro_step: bool = False) -> Any:
    def body(ctx: RankContext) -> tuple[int, int]:
        before = ctx.accelerator.current_device()
        engine, *_ = ds.initialize(model=MLP(), config=cfg)
        for _ in range(2 * engine.gradient_accumulation_steps()):
            loss = engine(torch.randn(2, DIM).to(ctx.device))
            engine.backward(loss)
            if host_copy_per_micro_step:
                loss.detach().cpu()  # what a logging line per micro-step would do
            engine.step()
        engine.destroy()
        return before, ctx.accelerator.current_device()

    return body


def test_each_rank_starts_on_device_0_and_initialize_selects_its_own() -> None:
    result = run_world(_train_body(config(2, "bf16")), 2)
    # A rank starts as a new process does (cuda:0 current); ds.initialize's own device setup
    # selects cuda:local_rank before the process group is used.
    assert result.values() == [(0, 0), (0, 1)]


def test_a_rank_that_never_selects_its_device_fails_its_first_collective() -> None:
    def body(ctx: RankContext) -> None:
        ctx.comm.all_reduce(torch.zeros(4, device=ctx.device))

    with pytest.raises(CommError, match=r"set_device\(1\)"):
        run_world(body, 2)


def test_a_blocking_copy_to_the_host_is_a_host_sync() -> None:
    with SimDevice(1) as dev:
        t = torch.ones(8, device=dev.device)
        host = torch.empty(8)
        t.cpu()
        t.to("cpu")
        host.copy_(t)
        assert len(dev.host_syncs) == 3
        assert all("test_sim_discipline.py" in s.where for s in dev.host_syncs)
        t.to("cpu", non_blocking=True)  # queued, not waited for
        host.to(dev.device)  # host to device: the host does not wait
        assert len(dev.host_syncs) == 3


def test_a_host_copy_per_micro_step_is_counted_against_the_sync_budget() -> None:
    cfg = config(1, "bf16")
    clean = run_world(_train_body(cfg), 2)
    copying = run_world(_train_body(cfg, host_copy_per_micro_step=True), 2)
    assert len(device_syncs(clean)) <= 2  # one per optimizer step
    extra = len(device_syncs(copying)) - len(device_syncs(clean))
    assert extra == 4, device_syncs(copying)  # 2 steps x 2 micro-steps


def test_events_are_complete_only_once_the_host_waits() -> None:
    accel = SimGpuAccelerator()
    with SimDevice(0) as dev:
        t = torch.ones(4, device=dev.device)
        start, end = accel.new_event(enable_timing=True), accel.new_event(enable_timing=True)
        start.record()
        host = t.sum().to("cpu", non_blocking=True)
        end.record()
        assert not end.query() and not start.query()
        with pytest.raises(AcceleratorError, match="non-blocking device-to-host copy"):
            host.item()
        with pytest.raises(AcceleratorError, match="not completed"):
            start.elapsed_time(end)
        synced = len(dev.host_syncs)
        end.synchronize()  # completes end and everything queued before it
        assert len(dev.host_syncs) == synced + 1
        assert start.query() and end.query()
        assert host.item() == 0.0 and start.elapsed_time(end) >= 0.0
        later = accel.new_event()
        later.record()
        t.sum().item()  # a blocking read waits for everything queued
        assert later.query()


def test_a_staged_loss_read_with_no_sync_between_waits_for_its_copy() -> None:
    """A step stages the loss copy before its one sync (the norm's read-back) and so reads it
    free; staged and read with no sync between, the engine's telemetry must wait on the copy."""
    from ds.zero.engine_telemetry import StepTelemetry

    with SimDevice(0) as dev:
        telemetry = StepTelemetry(SimGpuAccelerator())
        telemetry.add_loss(torch.ones((), device=dev.device))
        telemetry.stage_loss()
        before = len(dev.host_syncs)
        assert telemetry.take_loss() == 0.0
        assert [s.where for s in dev.host_syncs[before:]] == ["event.synchronize()"]
