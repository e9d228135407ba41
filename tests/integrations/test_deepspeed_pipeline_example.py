"""DeepSpeedExamples' training/pipeline_parallelism/train.py, byte for byte as upstream
(tests/integrations/deepspeed_examples/upstream, from DeepSpeedExamples 45b4b715), trains on ds
through ``ds compat enable`` on 2 CPU ranks: two pipeline stages of AlexNet, the engine's own
data iterator, ``deepspeed.runtime.utils.set_random_seed`` and the ``deepspeed.utils``
``RepeatingLoader`` import. Its environment (stand_ins/README.md): a torchvision stand-in (no
network, no torchvision) and ``torch.cuda.set_device`` as a no-op on CPU-only torch. The config
is upstream's with a 16-sample batch (2 micro-batches of 8) and a CSV monitor, so the test can
read each step's loss."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _compat_env import make_env

EXAMPLES = Path(__file__).parent / "deepspeed_examples"
UPSTREAM = EXAMPLES / "upstream" / "pipeline_parallelism"
ANNOUNCE = "the 'deepspeed' API in this process is served by ds"


def _read(path: Path) -> list[tuple[int, float]]:
    with path.open() as f:
        return [(int(r["step"]), float(r[path.stem.split("_", 2)[2]])) for r in csv.DictReader(f)]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_pipeline_parallelism_example_trains_unchanged(tmp_path: Path) -> None:
    py = make_env(tmp_path / "venv")
    enable = subprocess.run(
        [str(py), "-m", "ds.launcher", "compat", "enable"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert enable.returncode == 0, enable.stdout + enable.stderr
    cfg = json.loads((UPSTREAM / "ds_config.json").read_text())
    cfg.update(train_batch_size=16, train_micro_batch_size_per_gpu=8)
    cfg["csv_monitor"] = {"enabled": True, "output_path": str(tmp_path / "csv"), "job_name": "pp"}
    (tmp_path / "ds_config.json").write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=str(EXAMPLES / "stand_ins"), PYTHONUNBUFFERED="1")
    cmd = [
        str(py), "-m", "ds.launcher", "run", "--nproc", "2", str(UPSTREAM / "train.py"),
        "--deepspeed_config=ds_config.json", "-p", "2", "--steps=2", "--backend", "gloo",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=560)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert out.count(ANNOUNCE) == 1
    logs = tmp_path / "csv" / "pp"
    losses = _read(logs / "Train_Samples_train_loss.csv")
    assert [s for s, _ in losses] == [16, 32]  # two optimizer steps of 16 samples
    # Random labels over 10 classes: the first loss is about ln(10).
    assert abs(losses[0][1] - math.log(10)) < 0.5
    assert all(math.isfinite(v) for _, v in losses)
    norms = _read(logs / "Train_Samples_grad_norm.csv")
    assert len(norms) == 2 and all(0 < v < math.inf for _, v in norms)
