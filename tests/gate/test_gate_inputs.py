"""The gate's measured inputs, piece by piece, on real files and a real torch.distributed store:
the memory limit read as the cgroup files are, the exposed wait (not the latency) of a collective,
and the cross-rank comparison that finds the rank the others waited for."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from ds.interfaces.errors import ConfigError
from ds.interfaces.telemetry import CommEvent, StepMetrics
from ds.monitor import memory_limit
from ds.monitor.gate_signals import SignalBus
from ds.monitor.peer_waits import HORIZON, PeerWaits

GIB = 1 << 30


def test_limit_files_read_as_the_kernel_writes_them(tmp_path: Path) -> None:
    f = tmp_path / "memory.max"
    f.write_text("max\n")
    assert memory_limit.read_limit(f) is None
    f.write_text(f"{2 * GIB}\n")
    assert memory_limit.read_limit(f) == 2 * GIB
    f.write_text("9223372036854771712\n")  # cgroup v1's "no limit"
    assert memory_limit.read_limit(f) is None
    f.write_text("lots\n")
    with pytest.raises(ConfigError, match=r"memory\.max holds 'lots'.*byte count or 'max'"):
        memory_limit.read_limit(f)


def _limit_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: int) -> Path:
    """A memory.max-style file holding ``limit``, named by the override variable."""
    f = tmp_path / "memory.max"
    f.write_text(f"{limit}\n")
    monkeypatch.setenv(memory_limit.ENV, str(f))
    return f


def test_the_limit_file_override_and_the_effective_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = _limit_file(tmp_path, monkeypatch, 3 * GIB)
    assert memory_limit.cgroup_limit() == 3 * GIB
    assert memory_limit.host_memory_limit(64 * GIB) == 3 * GIB  # the container's, not the RAM
    assert memory_limit.host_memory_limit(2 * GIB) == 2 * GIB
    f.write_text("max\n")
    assert memory_limit.host_memory_limit(64 * GIB) == 64 * GIB
    monkeypatch.setenv(memory_limit.ENV, str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match=r"is not a file; point it at a memory\.max-style file"):
        memory_limit.cgroup_limit()


def test_cgroup_files_walk_up_from_the_process_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/job/rank0\n0::/job/rank0\n1:cpu:/\n")
    monkeypatch.setattr(memory_limit, "CGROUP_ROOT", tmp_path / "fs")
    got = [str(p.relative_to(tmp_path / "fs")) for p in memory_limit._cgroup_files(str(proc))]
    assert got == [
        "memory/job/rank0/memory.limit_in_bytes",
        "memory/job/memory.limit_in_bytes",
        "memory/memory.limit_in_bytes",
        "job/rank0/memory.max",
        "job/memory.max",
        "memory.max",
    ]


def test_stall_is_exposed_wait_not_latency() -> None:
    """An asynchronous gather that completed behind compute (latency 0.5 s, blocked 1 ms) is no
    stall; a blocking all-reduce's wait is."""
    bus = SignalBus()
    bus.on_comm(CommEvent("all_gather_into_tensor", 1 << 20, 0.5, 2, 0, wait_s=0.001))
    bus.on_comm(CommEvent("all_reduce", 1 << 20, 0.2, 2, 0, wait_s=0.2))
    m = bus.enrich(StepMetrics(step=3, loss=None, lr=0.1, step_time_s=0.6))
    assert m.allgather_stall_s == pytest.approx(0.001)
    assert m.sync_wait_s == pytest.approx(0.2)


def _ranks(store: dist.Store, world: int) -> list[PeerWaits]:
    return [PeerWaits(store, r, world, compare=r == 0) for r in range(world)]


def test_the_rank_that_waited_least_is_late_and_noise_cancels() -> None:
    store = dist.HashStore()
    ranks = _ranks(store, 3)
    out = None
    for step in range(1, 2 + HORIZON):
        # ranks 0 and 2 wait ~0.5 s on rank 1 in the all-reduce; the gather costs all ranks alike
        for r, peer in enumerate(ranks):
            peer.publish(step, 0.01, 0.02 if r == 1 else 0.52)
        out = ranks[0].compare_previous(step + 1)
    assert out is not None and out.late_rank == 1
    assert out.sync_stall_s == pytest.approx(0.5) and out.gather_stall_s == pytest.approx(0.0)

    noisy = _ranks(dist.HashStore(), 2)
    for step in range(1, 2 + HORIZON):  # each rank delayed in turn by the scheduler
        for r, peer in enumerate(noisy):
            peer.publish(step, 0.0, 0.3 if (step + r) % 2 else 0.0)
        out = noisy[0].compare_previous(step + 1)
    assert out is not None and out.sync_stall_s == pytest.approx(0.0, abs=0.031)


def test_a_step_some_rank_has_not_written_is_not_compared() -> None:
    store = dist.HashStore()
    r0, r1 = _ranks(store, 2)
    assert r0.compare_previous(1) is None  # nothing written yet: never blocks
    r0.publish(1, 0.0, 0.1)
    assert r0.compare_previous(2) is None
    r1.publish(1, 0.0, 0.0)
    assert r0.compare_previous(2) is None  # the start-up step is not compared
    for peer in (r0, r1):
        peer.publish(2, 0.0, 0.1 if peer is r0 else 0.0)
    c = r0.compare_previous(3)
    assert c is not None and c.step == 2 and c.late_rank == 1
    assert r1.compare_previous(3) is None  # only the comparing rank reads the store


def test_on_the_cpu_memory_is_held_against_the_container_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ds.accel.cpu import CpuAccelerator
    from ds.checkpoint.gate import ProductionDebtZeROGate

    _limit_file(tmp_path, monkeypatch, GIB)
    bus = SignalBus(accelerator=CpuAccelerator())
    rss = 512 << 20
    m = bus.enrich(StepMetrics(step=1, loss=None, lr=0.1, step_time_s=0.1, peak_host_rss_bytes=rss))
    assert m.host_memory_limit_bytes == GIB and m.allotted_device_bytes == GIB
    gate = ProductionDebtZeROGate(warmup_steps=0)
    a = gate.evaluate_training_step(m)
    assert a.metrics["zomm"] >= rss / GIB  # the RSS (and the device peak, here the same memory)
    monkeypatch.delenv(memory_limit.ENV)
    step = StepMetrics(step=1, loss=None, lr=0.1, step_time_s=0.1)
    unlimited = SignalBus(accelerator=CpuAccelerator()).enrich(step)
    assert unlimited.host_memory_limit_bytes > GIB  # this machine's own limit, not the file's
