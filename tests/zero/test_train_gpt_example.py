"""The README's main job: `ds run --nproc 2 examples/train_gpt.py` trains, checkpoints, records a
ledger and prints the summary table."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from main_job import ROOT, main_job


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_gpt_runs_under_the_launcher(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        main_job(30, out),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        # MFU on a CPU: the GEMM ceiling measured at the rank's thread count, cached here.
        env={
            **{
                k: v
                for k, v in os.environ.items()
                if k not in ("DS_PEAK_TFLOPS", "DS_PEAK_MEASURE")
            },
            "DS_PEAK_CACHE": str(tmp_path / "peak.json"),
        },
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    assert "ds train_gpt summary" in text and "readiness score" in text
    assert (out / "checkpoints" / "global_step30").is_dir()
    kinds = [json.loads(line)["kind"] for line in (out / "ledger.jsonl").read_text().splitlines()]
    assert kinds[0] == "run_start" and "checkpoint_save" in " ".join(kinds)
    assert re.search(r"MFU \d+\.\d\d% \(of \d+\.\d measured\)", text), text[-4000:]
    assert json.loads((tmp_path / "peak.json").read_text())  # measured once, then cached
