"""tools/bench/tp.py end to end at its smallest size: ds AutoTP and torch DTensor TP both train,
agree on the step-0 loss, and the JSON holds one timed row for each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_tp_bench_smallest_run_writes_both_rows(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "tools" / "bench" / "tp.py"), "--tiny", "--no-memory"]
    cmd += ["--steps", "2", "--repeats", "1", "--warmup", "0", "--timeout", "240"]
    env = dict(os.environ, DS_BENCH_DIR=str(tmp_path))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    data = json.loads((tmp_path / "tp.json").read_text())
    rows = {r["impl"]: r for r in data["results"]}
    assert set(rows) == {"ds", "torch"}
    assert all(len(r["times_s"]) == 2 and r["median_s"] > 0 for r in rows.values())
    assert data["loss0_agree"] is True
    assert abs(data["loss0"]["ds"] - data["loss0"]["plain"]) < 1e-4
