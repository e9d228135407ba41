"""The examples run as documented (2 processes each) and train."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DS = Path(sys.executable).with_name("ds")

pytestmark = pytest.mark.multiprocess


def _run(cmd: list[str], cwd: Path) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


@pytest.mark.timeout(300)
def test_plain_pytorch_example(tmp_path: Path) -> None:
    out = tmp_path / "losses.json"
    ckpt = tmp_path / "ckpt"
    script = str(EXAMPLES / "plain_pytorch.py")
    _run([str(DS), "run", "--nproc", "2", script, "--stage", "3", "--steps", "40",
          "--losses", str(out), "--checkpoint", str(ckpt)], tmp_path)  # fmt: skip
    got = json.loads(out.read_text())
    assert got["world_size"] == 2 and len(got["losses"]) == 40
    first, last = got["losses"][:10], got["losses"][-10:]
    assert sum(last) < 0.8 * sum(first)
    assert (ckpt / "latest").read_text().strip() == "global_step40"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lightning_example(tmp_path: Path) -> None:
    out = tmp_path / "losses.json"
    _run([sys.executable, str(EXAMPLES / "lightning_module.py"), "--strategy", "ds_zero3",
          "--devices", "2", "--steps", "6", "--losses", str(out), "--save", str(tmp_path / "ck")],
         tmp_path)  # fmt: skip
    got = json.loads(out.read_text())
    assert got["global_step"] == 6 and len(got["losses"]) == 6
    assert (tmp_path / "ck" / "latest").exists()
