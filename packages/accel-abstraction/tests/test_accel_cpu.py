import torch

from ds.accel.cpu import CpuAccelerator
from ds.interfaces.accelerator import Accelerator


def test_cpu_implements_the_whole_protocol():
    acc = CpuAccelerator()
    assert isinstance(acc, Accelerator)
    # Every Protocol member exists and is callable on the implementation.
    members = [m for m in dir(Accelerator) if not m.startswith("_")]
    for m in members:
        assert callable(getattr(acc, m)), m


def test_identity_and_backend():
    acc = CpuAccelerator()
    assert acc.name() == "cpu"
    assert acc.is_available()
    assert acc.device() == torch.device("cpu")
    assert acc.communication_backend_name() == "gloo"
    caps = acc.capabilities()
    assert caps.is_synchronized_device and not caps.has_streams


def test_memory_stats_track_a_real_allocation():
    acc = CpuAccelerator()
    acc.reset_peak_memory_stats()
    before = acc.memory_allocated()
    x = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, touched
    x.add_(1)
    after = acc.memory_allocated()
    assert after - before > 48 * 1024 * 1024
    assert acc.max_memory_allocated() >= after
    assert acc.total_memory() > acc.available_memory() > 0
    assert acc.memory_stats()["allocated_bytes.all.current"] > 0
    del x


def test_rng_state_roundtrip():
    acc = CpuAccelerator()
    acc.manual_seed(123)
    state = acc.get_rng_state()
    a = torch.rand(5)
    acc.set_rng_state(state)
    assert torch.equal(a, torch.rand(5))
    assert acc.initial_seed() == 123


def test_streams_and_events_are_usable_noops():
    acc = CpuAccelerator()
    s = acc.new_stream()
    with acc.stream(s):
        y = torch.ones(3) * 2
    acc.current_stream().synchronize()
    start, end = acc.new_event(enable_timing=True), acc.new_event(enable_timing=True)
    start.record()
    end.record()
    assert end.query() and start.elapsed_time(end) >= 0.0
    assert y.sum().item() == 6


def test_dtypes_and_pinning():
    acc = CpuAccelerator()
    assert acc.is_bf16_supported() and acc.is_fp16_supported()
    assert torch.bfloat16 in acc.supported_dtypes()
    t = torch.zeros(4)
    assert acc.pin_memory(t) is t and not acc.is_pinned(t)
    assert acc.on_accelerator(t)


def test_device_count_follows_local_world(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "2")
    acc = CpuAccelerator()
    assert acc.device_count() == 3 and acc.current_device() == 2
