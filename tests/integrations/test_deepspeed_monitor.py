"""``deepspeed.monitor``: DeepSpeed's monitor config and classes as views of ds's monitors
(``DeepSpeedConfig(...).monitor_config``, ``TensorBoardMonitor(section)``, ``MonitorMaster``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ds.full.compat.deepspeed.monitor.config import DeepSpeedMonitorConfig, get_monitor_config
from ds.full.compat.deepspeed.monitor.csv_monitor import csvMonitor
from ds.full.compat.deepspeed.monitor.monitor import MonitorMaster
from ds.full.compat.deepspeed.monitor.tensorboard import TensorBoardMonitor
from ds.full.compat.deepspeed.monitor.wandb import WandbMonitor
from ds.full.compat.deepspeed.runtime.config import DeepSpeedConfig
from ds.monitor.csv import CsvMonitor


def test_sections_and_defaults_are_deepspeeds() -> None:
    cfg = DeepSpeedConfig(
        {"train_batch_size": 2, "wandb": {"group": "g", "team": "t", "project": "p"},
         "csv_monitor": {}}
    )  # fmt: skip
    wandb = WandbMonitor(cfg.monitor_config.wandb)
    assert (wandb.enabled, wandb.group, wandb.team, wandb.project) == (False, "g", "t", "p")
    csv = csvMonitor(cfg.monitor_config.csv_monitor)
    defaults = DeepSpeedMonitorConfig().csv_monitor
    assert (csv.enabled, csv.output_path, csv.job_name) == (False, "", "DeepSpeedJobName")
    assert (defaults.output_path, defaults.job_name) == ("", "DeepSpeedJobName")
    assert DeepSpeedMonitorConfig().wandb.project == "deepspeed"
    assert not cfg.monitor_config.enabled
    assert get_monitor_config({"comet": {"enabled": True}}).enabled
    with pytest.raises(ValueError):
        get_monitor_config({"tensorboard": {"enabled": True, "output_pth": "x"}})


def test_monitor_master_writes_through_ds_monitors(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    cfg = DeepSpeedConfig(
        {
            "train_batch_size": 2,
            "tensorboard": {"enabled": True, "output_path": str(tmp_path / "tb"), "job_name": "a"},
            "csv_monitor": {"enabled": True, "output_path": str(tmp_path / "csv"), "job_name": "b"},
        }
    )
    master = MonitorMaster(cfg.monitor_config)
    assert master.enabled and master.wandb_monitor is None and master.comet_monitor is None
    assert isinstance(master.csv_monitor, CsvMonitor)  # ds's class does the writing
    assert master.tb_monitor.job_name == "a"
    master.write_events(
        [("Train/Samples/train_loss", 1.5, 2), ("Train/Samples/train_loss", 1.0, 4)]
    )
    master.close()
    lines = (tmp_path / "csv" / "b" / "Train_Samples_train_loss.csv").read_text().split()
    assert lines == ["step,train_loss", "2,1.5", "4,1.0"]
    assert list((tmp_path / "tb" / "a").glob("events.out.tfevents.*"))


def test_a_disabled_monitor_opens_nothing(tmp_path: Path) -> None:
    section = DeepSpeedMonitorConfig(
        tensorboard={"enabled": False, "output_path": str(tmp_path), "job_name": "x"}
    ).tensorboard
    tb = TensorBoardMonitor(section)
    tb.write_events([("a", 1.0, 1)])
    tb.close()
    assert not tb.enabled and not hasattr(tb, "writer") and list(tmp_path.iterdir()) == []
