"""tools/bench/pipeline.py end to end at its smallest size: every schedule trains at PP=2 and the
JSON holds its step times, the formula's bubble beside the measured one, and a row per stage."""

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
def test_pipeline_bench_smallest_run_writes_every_schedule(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "tools" / "bench" / "pipeline.py"), "--tiny"]
    cmd += ["--stages", "2", "--steps", "2", "--timeout", "240"]
    env = dict(os.environ, DS_BENCH_DIR=str(tmp_path))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    data = json.loads((tmp_path / "pipeline.json").read_text())
    rows = {r["schedule"]: r for r in data["results"]}
    assert set(rows) == {"gpipe", "1f1b", "interleaved_1f1b"}
    for r in rows.values():
        assert len(r["times_s"]) == 2 and r["median_s"] > 0
        assert r["bubble_formula"] == pytest.approx(1 / (r["chunks"] * r["microbatches"] + 1))
        assert 0 <= r["bubble_measured"] < 1
        assert [s["stage"] for s in r["per_stage"]] == [0, 1]
