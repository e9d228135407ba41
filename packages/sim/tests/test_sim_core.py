"""The simulation itself: fake CUDA devices, the strict communicator, the world replay."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError

from ds.accel import available_accelerators, get_accelerator, reset_accelerator
from ds.interfaces.errors import CommError
from ds.sim.accelerator import SimDevice, SimGpuAccelerator
from ds.sim.comm import SimWorld

pytestmark = pytest.mark.simgpu


def test_fake_cuda_autograd_placement_and_memory() -> None:
    with SimDevice(3) as dev:
        model = torch.nn.Linear(64, 32).to(dev.device)
        assert model.weight.device == torch.device("cuda:3")
        loss = model(torch.randn(4, 64, device=dev.device)).sum()
        loss.backward()
        assert model.weight.grad is not None and model.weight.grad.device == dev.device
        with pytest.raises(FakeTensorDeviceMismatchError):
            torch.zeros(32).add_(model.bias)  # a host tensor and a device tensor in one op
        with pytest.raises(FakeTensorDeviceMismatchError):
            model.bias + torch.zeros(32, device="cuda:2")  # another GPU's tensor
        float(loss.detach())  # a host sync, recorded with this line
        params = (64 * 32 + 32) * 4
        held = dev.device_bytes().current
    # weights + grads + the loss scalar: exact bytes, by construction
    assert held == 2 * params + 4
    assert [s.device for s in dev.host_syncs] == ["cuda:3"]
    assert "test_sim_core.py" in dev.host_syncs[0].where
    # autograd on the host is unaffected once the simulation is left
    x = torch.ones(3, requires_grad=True)
    (x * 2).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    assert not torch.cuda.is_available()


def test_memory_released_and_peak() -> None:
    with SimDevice(0) as dev:
        a = torch.empty(1000, device=dev.device)
        b = torch.empty(500, device=dev.device)
        view = a[:10]
        del a  # the view keeps the storage
        assert dev.device_bytes().current == 6000
        del view, b
        stats = dev.device_bytes()
    assert stats.current == 0 and stats.peak == 6000


def test_a_reused_storage_address_is_booked_on_its_own_device() -> None:
    # Moving a tensor to the host by re-pointing ``.data`` (as optimizer offload does) frees its
    # device storage while the tensor lives on; the allocator then hands the same address to the
    # next host storage. That host storage must not be booked on the device.
    with SimDevice(0) as dev:
        kept = []
        for _ in range(64):
            moved = torch.empty(1000, device=dev.device)
            moved.data = torch.empty(1000)
            kept += [moved, torch.empty(1000) + 1]
        mem = dev.memory()
    assert mem["cuda:0"].current == 0
    assert mem["cpu"].current == 64 * 2 * 4000


def test_simgpu_is_never_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    assert "simgpu" in available_accelerators()
    reset_accelerator()
    try:
        assert get_accelerator().name() != "simgpu"
    finally:
        reset_accelerator()
    with SimDevice(5):
        acc = SimGpuAccelerator()
        assert acc.is_available() and acc.current_device_name() == "cuda:5"


def _run(world: SimWorld, body) -> None:  # type: ignore[no-untyped-def]
    for r in range(world.world_size):
        with world.rank(r) as comm, SimDevice(world.local_rank(r)) as dev:
            body(r, comm, dev.device)


def test_strict_communicator_refuses_host_and_foreign_tensors() -> None:
    world = SimWorld(8)
    with world.rank(2) as comm, SimDevice(2) as dev:
        comm.all_reduce(torch.zeros(4, device=dev.device))
        with pytest.raises(CommError, match=r"host tensor.*cuda:2"):
            comm.all_reduce(torch.zeros(4, dtype=torch.float64))
        with pytest.raises(CommError, match="cuda:1"):
            comm.broadcast(torch.zeros(4, device="cuda:1"), src=0)
        out = torch.empty(8 * 4, device=dev.device)
        comm.all_gather_into_tensor(out, torch.zeros(4, device=dev.device))
        with pytest.raises(CommError, match="needs 8 x 4"):
            comm.all_gather_into_tensor(
                torch.empty(5, device=dev.device), torch.zeros(4, device=dev.device)
            )


def test_world_check_finds_size_and_order_mismatches() -> None:
    world = SimWorld(8)
    _run(world, lambda r, comm, d: comm.all_reduce(torch.zeros(16 + (r == 5), device=d)))
    with pytest.raises(CommError, match="rank 5 issued all_reduce sum float32\\[17\\]"):
        world.check()

    world = SimWorld(4)

    def swapped(r: int, comm, d) -> None:  # type: ignore[no-untyped-def]
        ops = [
            lambda: comm.all_reduce(torch.zeros(4, device=d)),
            lambda: comm.broadcast(torch.zeros(4, device=d), src=0),
        ]
        for op in ops if r != 3 else ops[::-1]:
            op()

    _run(world, swapped)
    with pytest.raises(CommError, match="mismatch"):
        world.check()


def test_world_check_finds_the_send_first_deadlock_and_accepts_batches() -> None:
    world = SimWorld(4)

    def send_first(r: int, comm, d) -> None:  # type: ignore[no-untyped-def]
        for p in range(4):
            if p != r:
                comm.isend(torch.zeros(8, device=d), p)
                comm.irecv(torch.zeros(8, device=d), p)

    _run(world, send_first)
    with pytest.raises(CommError, match="deadlock"):
        world.check()

    world = SimWorld(4)

    def batched(r: int, comm, d) -> None:  # type: ignore[no-untyped-def]
        ops = []
        for p in range(4):
            if p != r:
                ops.append(dist.P2POp(dist.isend, torch.zeros(8, device=d), p))
                ops.append(dist.P2POp(dist.irecv, torch.zeros(8, device=d), p))
        for work in comm.batch_isend_irecv(ops):
            work.wait()

    _run(world, batched)
    world.check()
    assert world.traffic(0)["batch"] == 6 * 8 * 4
