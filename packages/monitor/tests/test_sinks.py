"""Each monitor writes DeepSpeed's event names, and its tool's reader gets the values back."""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path

import pytest
from readers import comet_metrics, tensorboard_scalars, wandb_history

from ds.interfaces.errors import ConfigError
from ds.interfaces.telemetry import EventBus, StepMetrics
from ds.monitor import MonitorHub, step_events
from ds.monitor.hub import requested

LOSSES = [2.5, 2.0, 1.75]


def _metrics(step: int, loss: float, rank: int = 0) -> StepMetrics:
    return StepMetrics(
        step=step,
        loss=loss,
        lr=0.01 * step,
        step_time_s=0.5,
        comm_s=0.125,
        samples=8,
        rank=rank,
        world_size=2,
        peak_host_rss_bytes=1 << 20,
        grad_norm=1.5,
    )


def _run(hub: MonitorHub) -> None:
    bus = EventBus()
    hub.attach(bus)
    for i, loss in enumerate(LOSSES, start=1):
        bus.publish(_metrics(i, loss))
    hub.close()
    assert not bus.errors, bus.errors


def test_event_names_and_x_axis_are_deepspeeds() -> None:
    events = step_events(_metrics(1, 2.5), 8)
    names = {n: (v, x) for n, v, x in events}
    assert names["Train/Samples/train_loss"] == (2.5, 8)
    assert names["Train/Samples/lr"] == (0.01, 8)
    assert names["Train/Samples/samples_per_s"] == (16.0, 8)
    assert names["Train/Samples/comm_share"] == (0.25, 8)
    assert "Train/Samples/loss_scale" not in names  # only fp16 has one


def test_tensorboard_round_trip(tmp_path: Path) -> None:
    cfg = {"tensorboard": {"enabled": True, "output_path": str(tmp_path), "job_name": "job"}}
    _run(MonitorHub.from_config(cfg, rank=0, env={}))
    scalars = tensorboard_scalars(tmp_path / "job")
    assert scalars["Train/Samples/train_loss"] == [(8, 2.5), (16, 2.0), (24, 1.75)]
    assert [v for _, v in scalars["Train/Samples/lr"]] == pytest.approx([0.01, 0.02, 0.03])


def test_csv_round_trip_in_deepspeeds_layout(tmp_path: Path) -> None:
    cfg = {"csv_monitor": {"enabled": True, "output_path": str(tmp_path), "job_name": "j"}}
    _run(MonitorHub.from_config(cfg, rank=0, env={}))
    with (tmp_path / "j" / "Train_Samples_train_loss.csv").open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["step", "train_loss"]
    assert [(int(a), float(b)) for a, b in rows[1:]] == [(8, 2.5), (16, 2.0), (24, 1.75)]


def test_wandb_offline_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    _run(MonitorHub.from_config({"wandb": {"enabled": True, "project": "p"}}, rank=0, env={}))
    run_dir = next((tmp_path / "wandb").glob("offline-run-*"))
    # wandb's own service process writes the run file; after finish() its last records can
    # still be on the way to disk on a loaded machine (seen once in a full-suite run), so the
    # reader waits a bounded time for all three.
    deadline = time.monotonic() + 30
    while True:
        history = wandb_history(run_dir)
        if len(history) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    losses = [(step, h["Train/Samples/train_loss"]) for step, h in history]
    assert losses == [(8, 2.5), (16, 2.0), (24, 1.75)]


def test_comet_offline_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path))
    monkeypatch.setenv("COMET_DISABLE_AUTO_LOGGING", "1")
    cfg = {"comet": {"enabled": True, "online": False, "project": "p", "samples_log_interval": 16}}
    _run(MonitorHub.from_config(cfg, rank=0, env={}))
    metrics = comet_metrics(next(tmp_path.glob("*.zip")))
    # logged at most once per 16 samples: x = 8 (first), then 24 (8 + 16)
    assert [(v, x) for n, v, x in metrics if n == "Train/Samples/train_loss"] == [
        (2.5, 8),
        (1.75, 24),
    ]


def test_rank_zero_only_unless_told(tmp_path: Path) -> None:
    cfg = {"csv_monitor": {"enabled": True, "output_path": str(tmp_path), "job_name": "j"}}
    hub = MonitorHub.from_config(cfg, rank=1, env={})
    assert hub is not None and hub.monitors == []
    assert not (tmp_path / "j").exists()
    hub = MonitorHub.from_config(cfg, rank=1, env={"DS_MONITOR_ALL_RANKS": "1"})
    _run(hub)
    assert (tmp_path / "j" / "rank1" / "Train_Samples_train_loss.csv").exists()


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    cfg = {"csv_monitor": {"enabled": True, "output_path": str(blocker), "job_name": "j"}}
    with pytest.raises(ConfigError, match=r"csv_monitor.output_path: cannot write") as err:
        MonitorHub.from_config(cfg, rank=0, env={})
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"unknown monitor 'nosuch'.*registered monitors: comet"):
        requested({}, {"DS_MONITORS": "nosuch"})
    assert MonitorHub.from_config({"tensorboard": {"enabled": False}}, rank=0, env={}) is None


def test_missing_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real = builtins.__import__

    def no_wandb(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == "wandb":
            raise ImportError("No module named 'wandb'", name="wandb")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    monkeypatch.delitem(__import__("sys").modules, "wandb", raising=False)
    with pytest.raises(ConfigError, match=r"pip install 'ds-monitor\[wandb\]'"):
        MonitorHub.from_config({"wandb": {"enabled": True}}, rank=0, env={})
    assert os.environ.get("WANDB_MODE") != "online"
