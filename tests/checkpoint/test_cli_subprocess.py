"""The verbs through the `ds` console script (the launcher dispatches to this package's mains)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.ledger import RunLedger
from ds.checkpoint.sharding import shard_state

DS = shutil.which("ds") or str(Path(sys.executable).with_name("ds"))


def _ds(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DS, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(180)
def test_ds_checkpoint_and_ledger_verbs(tmp_path: Path) -> None:
    if not Path(DS).exists():
        pytest.fail("the ds console script is not installed (pip install -e packages/launcher)")
    ledger_path = str(tmp_path / "run.jsonl")
    with RunLedger(ledger_path) as led:
        led.record_training_event("step", {"step": 1})
        ShardedCheckpointEngine(ledger=led).save(
            str(tmp_path / "ck"), "s1", shard_state({"w": torch.randn(8, 8)}, 0, 1)
        )
        led.record_training_event("step", {"step": 2})
        led.tree_head()
    r = _ds("checkpoint", "verify", str(tmp_path / "ck"), "--ledger", ledger_path)
    assert r.returncode == 0, r.stderr
    r = _ds("ledger", "verify", ledger_path)
    assert r.returncode == 0 and "3 records" in r.stdout and "UNSIGNED" in r.stdout, r
    lines = Path(ledger_path).read_text().splitlines(keepends=True)
    del lines[1]  # the checkpoint_save record disappears
    Path(ledger_path).write_text("".join(lines))
    r = _ds("ledger", "verify", ledger_path)
    assert r.returncode == 1 and "first bad record 1" in r.stdout, r
    r = _ds("checkpoint", "verify", str(tmp_path / "ck"), "--ledger", ledger_path)
    assert r.returncode == 1 and "no checkpoint_save record" in r.stdout, r
