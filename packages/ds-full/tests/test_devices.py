"""The rank's device: local rank -> device index -> set_device, and the model's placement.

No GPU here: placement is checked on the real ``meta`` device (a device other than the CPU that
every torch build has) and device selection through an accelerator whose device count and
``set_device`` are observable; the simulated-GPU suite (marker ``simgpu``) runs the same code on
simulated cuda devices.
"""

from __future__ import annotations

import pytest
import torch

import ds.full as ds
from ds.accel.cpu import CpuAccelerator
from ds.full import devices
from ds.interfaces.errors import ConfigError


class FourDevices(CpuAccelerator):
    """Four devices on this node; ``set_device`` remembered (the CPU accelerator's is a no-op)."""

    def __init__(self) -> None:
        super().__init__()
        self.current: int | None = None

    def name(self) -> str:
        return "four"

    def device_count(self) -> int:
        return 4

    def set_device(self, index: int) -> None:
        self.current = index


def test_local_rank_sources_in_order() -> None:
    assert devices.local_rank({}) == 0
    assert devices.local_rank({"SLURM_LOCALID": "3"}) == 3
    assert devices.local_rank({"LOCAL_RANK": "1", "SLURM_LOCALID": "3"}) == 1
    assert devices.local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "2"}) == 2
    with pytest.raises(ConfigError, match="LOCAL_RANK='x' is not a local rank"):
        devices.local_rank({"LOCAL_RANK": "x"})


def test_each_local_rank_binds_its_own_device() -> None:
    for rank in range(4):
        acc = FourDevices()
        devices.bind_rank_device(acc, {"LOCAL_RANK": str(rank)})
        assert acc.current == rank  # not device 0 for everyone


def test_device_index_rules() -> None:
    assert devices.device_index(3, 8, "cuda", {}) == 3
    assert devices.device_index(5, 1, "cuda", {}) == 0  # one device bound per rank by the runner
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    with pytest.raises(ConfigError) as err:
        devices.device_index(2, 2, "cuda", env)
    msg = str(err.value)
    assert "\n" not in msg
    assert "local rank 2 has no cuda device: 2 are visible" in msg
    assert "CUDA_VISIBLE_DEVICES='0,1'" in msg


def test_cpu_model_moves_to_the_rank_device() -> None:
    model = torch.nn.Linear(3, 2)
    assert devices.place_model(model, torch.device("meta")) is True
    assert model.weight.device.type == "meta" and model.bias.device.type == "meta"
    assert devices.place_model(model, torch.device("meta")) is False


def test_model_on_two_devices_names_the_parameter_and_both_devices() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    model[1].to("meta")
    with pytest.raises(ConfigError) as err:
        devices.place_model(model, torch.device("cpu"))
    msg = str(err.value)
    assert "'1.weight' is on meta but '0.weight' is on cpu" in msg and "\n" not in msg


def test_model_on_another_device_than_the_rank_is_refused() -> None:
    model = torch.nn.Linear(3, 2, device="meta")
    with pytest.raises(ConfigError, match="'weight' is on meta but this rank's device is cpu"):
        devices.place_model(model, torch.device("cpu"))


def test_initialize_refuses_a_split_model() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    model[0].to("meta")
    cfg = {"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    with pytest.raises(ConfigError, match="model tensors on two devices"):
        ds.initialize(model=model, config=cfg)


def test_kernel_provider_follows_the_device() -> None:
    from ds.full.training import _kernels_for
    from ds.zero.config import load_config

    def zero(**kw: object) -> object:
        return load_config({"train_batch_size": 1, "zero_optimization": kw}).zero_optimization

    assert _kernels_for(zero(stage=2), torch.device("cpu")) is None
    cpu_offload = zero(stage=2, offload_optimizer={"device": "cpu"})
    assert _kernels_for(cpu_offload, torch.device("cuda:1")).name() == "cpu"
    assert _kernels_for(zero(stage=2), torch.device("cuda:1")).name() == "cuda"
    nvme_params = zero(stage=3, offload_param={"device": "nvme", "nvme_path": "/tmp"})
    assert _kernels_for(nvme_params, torch.device("cpu")).name() == "cpu"
    # A device model with NVMe parameters: the device provider also opens the file I/O handle.
    assert _kernels_for(nvme_params, torch.device("cuda:0")).name() == "cuda"


def test_init_distributed_binds_the_local_rank_device_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "2")
    acc = FourDevices()
    ds.init_distributed(accelerator=acc)
    assert acc.current == 2
