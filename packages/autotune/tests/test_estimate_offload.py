"""``ds estimate --offload``: every choice reaches the engine's config, NVMe ones included; a bad
choice is one line naming the choices."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ds.autotune import estimate_cli
from ds.autotune.estimate import OFFLOADS, ds_config
from ds.full import initialize  # the engine measured: ds-full hands it to `ds estimate`
from ds.interfaces.errors import ConfigError
from ds.zero.config import load_config

TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "vocab_size": 256,
}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return tmp_path


@pytest.mark.parametrize(
    ("offload", "optimizer", "param"),
    [("nvme", "nvme", "none"), ("nvme+param", "nvme", "nvme"), ("cpu+param", "cpu", "cpu")],
)
def test_offload_choices_reach_the_engine_config(offload: str, optimizer: str, param: str) -> None:
    job = {
        "train_batch_size": 64,  # the job's own world's; the point's follows from its micro-batch
        "zero_optimization": {"stage": 1, "offload_param": {"buffer_count": 3}},
        "fp16": {"enabled": True, "initial_scale_power": 12},
    }
    cfg = load_config(ds_config(3, offload, 2, "bf16", job, nvme_path="/swap"))
    zero = cfg.zero_optimization
    assert (zero.stage, zero.offload_optimizer_device, zero.offload_param_device) == (
        3,
        optimizer,
        param,
    )
    if param != "none":
        assert zero.offload_param is not None and zero.offload_param.buffer_count == 3
    if optimizer == "nvme":
        assert zero.offload_optimizer is not None and zero.offload_optimizer.nvme_path == "/swap"
    assert cfg.bf16.enabled and not cfg.fp16.enabled
    assert cfg.train_micro_batch_size_per_gpu == 2


def test_nvme_offload_is_stage_3s_and_needs_a_path() -> None:
    with pytest.raises(ConfigError, match="does not run at ZeRO stage 2"):
        ds_config(2, "nvme", 1, "bf16", nvme_path="/swap")
    with pytest.raises(ConfigError, match="needs an NVMe path"):
        ds_config(3, "nvme+param", 1, "bf16")


def test_a_bad_offload_names_the_choices(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        estimate_cli.main(["--model", str(model), "--offload", "cpu,disk"], initialize=initialize)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "'disk'" in err and ", ".join(OFFLOADS) in err
    with pytest.raises(ConfigError, match="choose from none, cpu, cpu\\+param, nvme, nvme\\+param"):
        ds_config(3, "disk", 1, "bf16")


@pytest.mark.simgpu
def test_the_command_runs_nvme_points_on_cpu_ranks(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[dict[str, Any]] = []

    def recording(**kwargs: Any) -> Any:
        seen.append(kwargs["config"])
        return initialize(**kwargs)

    job = tmp_path / "job.json"
    job.write_text(json.dumps({"zero_optimization": {"offload_optimizer": {"buffer_count": 2}}}))
    argv = ["--model", str(model), "--world", "1", "--stages", "3", "--offload", "nvme+param",
            "--backend", "gloo", "--dtype", "fp32", "--config", str(job), "--json"]  # fmt: skip
    assert estimate_cli.main(argv, initialize=recording) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    zero = load_config(seen[0]).zero_optimization
    assert (zero.offload_optimizer_device, zero.offload_param_device) == ("nvme", "nvme")
    assert zero.offload_optimizer is not None and zero.offload_optimizer.buffer_count == 2
    assert not Path(str(zero.offload_param.nvme_path)).exists()  # the temporary one, removed
    # A CPU rank: one memory, reported as the device's.
    assert row["offload"] == "nvme+param" and row["host_peak"] == 0
    assert row["device_peak"] > row["device_states"] > 0
