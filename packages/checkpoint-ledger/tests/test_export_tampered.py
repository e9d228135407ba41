"""Every ``ds checkpoint export`` route refuses a shard that differs from its manifest digest, as
load and ``verify`` do: one line naming the file, exit code 1 (a changed checkpoint; operator
errors are 2), and nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ds.checkpoint import cli
from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.sharding import shard_state

SHARD = "shard-00000-of-00001.bin"


@pytest.fixture
def tampered(tmp_path: Path) -> Path:
    d = tmp_path / "ck"
    sd = {"module.w": torch.randn(8, 4), "module.b": torch.randn(4)}
    ShardedCheckpointEngine().save(str(d), "s1", shard_state(sd, 0, 1))
    shard = d / "s1" / SHARD
    data = bytearray(shard.read_bytes())
    data[0] ^= 0xFF  # the first element of the first tensor
    shard.write_bytes(bytes(data))
    return d


@pytest.mark.parametrize(
    "route",
    [
        ["--to", "safetensors", "--out", "{out}/model.safetensors"],
        ["--to", "torch", "--out", "{out}/pytorch_model.bin"],
        ["{out}"],  # zero_to_fp32.py's form
        ["{out}", "--safe_serialization"],
    ],
)
def test_every_export_route_refuses_a_changed_shard(
    tampered: Path, tmp_path: Path, route: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert cli.main(["export", str(tampered), *(a.format(out=out) for a in route)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and SHARD in err and "SHA-256" in err, err
    assert "nothing was loaded" in err and "ds checkpoint verify" in err  # what to do
    assert list(out.iterdir()) == []


def test_console_script_exit_codes_tell_damage_from_operator_error(
    tampered: Path, tmp_path: Path
) -> None:
    ds = Path(sys.executable).with_name("ds")
    out = str(tmp_path / "m.safetensors")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(ds), "checkpoint", "export", str(tampered), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    proc = run("--to", "safetensors", "--out", out)
    assert proc.returncode == 1 and SHARD in proc.stderr, proc.stderr
    proc = run("--to", "safetensors", "--out", out, "--tag", "../ck/s1")
    assert proc.returncode == 2 and "not usable as a directory name" in proc.stderr, proc.stderr
    assert not Path(out).exists()
