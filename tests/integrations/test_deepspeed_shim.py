"""The ``deepspeed`` migration shim: a DeepSpeed-style script runs unchanged on ds (2 ranks,
ZeRO-3 with zero.Init, GatheredParameters, checkpoints), and the shim never hides a real DeepSpeed
without being asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).with_name("deepspeed_style")
DS = Path(sys.executable).with_name("ds")


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_deepspeed_script_runs_unchanged(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    cmd = [
        str(DS), "run", "--nproc", "2",
        str(HERE / "run_with_shim.py"), str(HERE / "train.py"),
        "--deepspeed", "--deepspeed_config", str(HERE / "ds_config.json"),
        "--out", str(out), "--ckpt", str(tmp_path / "ckpt"),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    got = json.loads(out.read_text())
    assert got["world_size"] == 2 and got["stage"] == 3
    # 64 samples / (8 per rank x 2 ranks) = 4 steps per epoch, 3 epochs.
    assert got["global_steps"] == 12 and len(got["losses"]) == 12
    assert sum(got["losses"][-4:]) < sum(got["losses"][:4])
    # GatheredParameters made the ZeRO-3 partitioned parameters whole.
    assert got["shapes"] == [[24, 12], [24], [1, 24], [1]]
    assert got["client"] == {"epoch": 3}


def test_names_map_onto_ds() -> None:
    import ds.comm
    import ds.full
    import ds.full.compat.deepspeed as deepspeed
    import ds.zero
    from ds.zero.engine import ZeroEngine

    assert deepspeed.initialize is ds.full.initialize
    assert deepspeed.init_distributed is ds.full.init_distributed
    assert deepspeed.DeepSpeedEngine is ZeroEngine
    assert deepspeed.zero.Init is ds.zero.Init
    assert deepspeed.zero.GatheredParameters is ds.zero.GatheredParameters
    assert deepspeed.comm.all_reduce is ds.comm.all_reduce
    assert deepspeed.checkpointing.checkpoint is ds.zero.checkpointing.checkpoint
    with pytest.raises(AttributeError, match="no ds equivalent"):
        _ = deepspeed.PipelineEngine


def test_install_refuses_to_hide_real_deepspeed_unless_asked() -> None:
    code = (
        "import importlib.util, sys, ds.full.compat as c\n"
        "real = importlib.util.find_spec('deepspeed') is not None\n"
        "try:\n    c.install()\n    print('installed', real)\n"
        "except Exception as e:\n    print('refused', real, type(e).__name__)\n"
        "c.install(shadow=True)\nimport deepspeed\nprint(deepspeed.__name__)\n"
        "c.uninstall()\nprint('deepspeed' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    real = lines[1] == "True"
    # With DeepSpeed installed, a plain install() refuses; without it, install() just works.
    assert lines[0] == ("refused" if real else "installed")
    if real:
        assert lines[2] == "ConfigError"
    assert "ds.full.compat.deepspeed" in lines
    assert lines[-1] == "False"
