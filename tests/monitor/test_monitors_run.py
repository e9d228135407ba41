"""A real 2-rank run with each monitor: every tool's own reader parses back the logged values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "packages" / "monitor" / "tests"))

from readers import comet_metrics, tensorboard_scalars, wandb_history  # noqa: E402


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_rank_run_writes_every_monitor(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        WANDB_MODE="offline",
        WANDB_DIR=str(tmp_path),
        WANDB_SILENT="true",
        COMET_OFFLINE_DIRECTORY=str(tmp_path / "comet"),
        COMET_DISABLE_AUTO_LOGGING="1",
        OMP_NUM_THREADS="1",
    )
    ds_cli = Path(sys.executable).parent / "ds"
    proc = subprocess.run(
        [str(ds_cli), "run", "--nproc", "2", str(HERE / "_train.py"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    losses = json.loads((tmp_path / "losses.json").read_text())
    xs = [4, 8, 12, 16]  # global samples: 2 ranks x micro-batch 2 per step
    expected = list(zip(xs, losses))

    tb = tensorboard_scalars(tmp_path / "tb" / "job")
    assert [(x, pytest.approx(v)) for x, v in tb["Train/Samples/train_loss"]] == expected
    assert "Train/Samples/tokens_per_s" in tb and "Train/Samples/step_time_s" in tb

    rows = (tmp_path / "csv" / "job" / "Train_Samples_train_loss.csv").read_text().split()
    assert rows[0] == "step,train_loss"
    assert [
        (int(a), pytest.approx(float(b))) for a, b in (r.split(",") for r in rows[1:])
    ] == expected

    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, "rank 1 must not open a wandb run"
    history = wandb_history(runs[0])
    assert [(s, pytest.approx(h["Train/Samples/train_loss"])) for s, h in history] == expected

    archives = list((tmp_path / "comet").glob("*.zip"))
    assert len(archives) == 1
    got = [(x, v) for n, v, x in comet_metrics(archives[0]) if n == "Train/Samples/train_loss"]
    assert [(x, pytest.approx(v)) for x, v in got] == expected

    profile = (tmp_path / "flops.txt").read_text()
    # per forward: batch 2 x 8 tokens through Linear(16, 24) and Linear(24, 32)
    macs = 16 * (16 * 24 + 24 * 32)
    assert "profile step:                 2" in profile
    assert f"fwd MACs per device:          {macs / 1e3:.2f} KMACs" in profile
