"""Fabric strategies on 2 CPU processes: loss parity with Fabric's DDP and a save/load round trip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("fabric_worker.py")


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fabric_strategies_match_ddp_and_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "fabric.json"
    cmd = [sys.executable, str(WORKER), "--strategies", "ddp,ds_zero2,ds_zero3",
           "--out", str(out), "--ckpt", str(tmp_path / "ckpt")]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    got = json.loads(out.read_text())
    ref = got["ddp"]["losses"]
    assert len(ref) == 6
    for name in ("ds_zero2", "ds_zero3"):
        run = got[name]
        assert run["losses"] == pytest.approx(ref, rel=1e-5)
        assert run["restored_step"] == 6
        assert run["after_extra_step"] != pytest.approx(run["before_save"], rel=1e-4)
        assert run["after_load"] == pytest.approx(run["before_save"], rel=1e-6)
