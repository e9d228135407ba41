"""The main job exits 0: no "terminate called without an active exception" at interpreter exit.

Root cause (see examples/train_gpt.py ``shutdown``): the process group was left for interpreter
finalization to destroy; gloo's run-loop threads then drop their last reference to a finished
collective's Python-made tensors while Python finalizes, need the GIL, are ended by pthread_exit
and the unwind through gloo's noexcept loop aborts the process (exit 134).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from main_job import ROOT, ds_run, main_job

pytestmark = pytest.mark.multiprocess


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
    )


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("ending", ["example", "full"])
def test_ending_with_collectives_in_flight_exits_cleanly(ending: str) -> None:
    # With the old ending (EXIT_PATH=plain) this worker aborted in 7 of 10 runs here (and 2 of 3
    # in a later check), so four clean runs in a row happen by chance under 1 % of the time
    # without the fix. "example": train_gpt.py's shutdown; "full": ds.full's exit hook alone.
    for i in range(4):
        worker = ROOT / "tests" / "checkpoint" / "_exit_worker.py"
        proc = _run(ds_run(worker), {"EXIT_PATH": ending}, 60)
        text = proc.stdout + proc.stderr
        assert "terminate called" not in text, f"run {i}: {text[-2000:]}"
        assert proc.returncode == 0, f"run {i}: {text[-2000:]}"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_main_job_exits_0_twice_in_a_row(tmp_path: Path) -> None:
    # The abort itself is caught by the four-run loops above (the same shutdown paths on a
    # smaller worker); these two runs hold the whole main job, checkpoint and ledger included.
    for i in range(2):
        out = tmp_path / f"run{i}"
        proc = _run(main_job(12, out), {}, 280)
        text = proc.stdout + proc.stderr
        assert "terminate called" not in text, f"run {i}: {text[-3000:]}"
        assert proc.returncode == 0, f"run {i}: {text[-3000:]}"
        assert (out / "checkpoints" / "global_step12" / "ledger_head.json").is_file()
