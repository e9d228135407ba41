"""A config ``scheduler`` section drives the LR under DsTrainer (as DeepSpeed's engine does under
transformers), with its "auto" values filled from TrainingArguments; once it was dropped silently
and the Trainer's own schedule used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ds.zero.lr_schedules import WarmupLR

WORKER = Path(__file__).with_name("hf_schedule_worker.py")

pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(400)
def test_config_scheduler_drives_the_learning_rate(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=380,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # warmup_min_lr 0 (not a Trainer argument), warmup_max_lr = learning_rate, warmup_num_steps =
    # warmup_steps: transformers' fill rules.
    assert report["config"]["params"] == {
        "warmup_min_lr": 0,
        "warmup_max_lr": 1e-2,
        "warmup_num_steps": 4,
    }
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-2)
    schedule = WarmupLR(opt, warmup_min_lr=0.0, warmup_max_lr=1e-2, warmup_num_steps=4)
    expected = []
    for _ in range(6):
        schedule.step()
        expected.append(opt.param_groups[0]["lr"])
    assert report["rates"] == pytest.approx(expected, rel=1e-6)
    # The Trainer's own schedule (linear warm-up over 4 steps, then linear decay) differs.
    linear = [1e-2 * min((s + 1) / 4, (6 - s - 1) / 2) for s in range(6)]
    assert report["rates"] != pytest.approx(linear, rel=1e-3)
