"""``zero_to_fp32.py`` in a ZeRO checkpoint's folder, run as DeepSpeed's users run it.

A real 2-rank gloo run saves ZeRO-2 and ZeRO-3 checkpoints; the script rank 0 left beside
``latest`` is run as a subprocess (``python zero_to_fp32.py . out``, and ``--safe_serialization``)
and must write exactly what ``ds checkpoint export`` writes and the engine's own consolidated
weights, bit for bit. A save where ``chmod`` fails still completes and warns.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file
from world import run_script

from ds.checkpoint import cli

WORKER = Path(__file__).with_name("_recovery_script_worker.py")


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype == torch.float32, name
        assert torch.equal(a[name], b[name]), name


def _run_script(ckpt: Path, *args: str) -> Path:
    out = ckpt / "fp32"
    proc = subprocess.run(
        [sys.executable, "zero_to_fp32.py", ".", "fp32", *args],
        cwd=ckpt,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "wrote" in proc.stdout
    return out


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_script_left_by_zero2_and_zero3_saves_exports_the_engine_weights(tmp_path: Path) -> None:
    run_script(WORKER, 2, lambda r, _port: [str(r), "2", str(tmp_path), "2", "3"], timeout=240)
    for stage, safe in ((2, False), (3, True)):
        ckpt = tmp_path / f"stage{stage}"
        script = ckpt / "zero_to_fp32.py"
        assert (ckpt / "latest").is_file() and script.is_file()
        assert os.stat(script).st_mode & 0o100, "the script is executable"
        engine = torch.load(tmp_path / f"engine_stage{stage}.pt", weights_only=True)
        flag = ["--safe_serialization"] if safe else []
        got_dir = _run_script(ckpt, *flag)
        ref_dir = tmp_path / f"export{stage}"
        assert cli.main(["export", str(ckpt), str(ref_dir), *flag]) == 0
        name = "model.safetensors" if safe else "pytorch_model.bin"
        assert sorted(os.listdir(got_dir)) == sorted(os.listdir(ref_dir)) == [name]
        if safe:
            got, ref = load_file(str(got_dir / name)), load_file(str(ref_dir / name))
        else:
            got = torch.load(got_dir / name, weights_only=True)
            ref = torch.load(ref_dir / name, weights_only=True)
        _equal(got, ref)
        _equal(got, engine)
        # The script sits beside the tags, outside every manifest: the tag still verifies.
        assert cli.main(["verify", str(ckpt)]) == 0


def _save(tmp_path: Path, stage: int) -> Path:
    import ds.full

    torch.manual_seed(0)
    cfg = {"train_batch_size": 2, "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
           "zero_optimization": {"stage": stage}}  # fmt: skip
    engine, *_ = ds.full.initialize(model=torch.nn.Linear(4, 2), config=cfg)
    engine.backward(engine(torch.randn(2, 4)).pow(2).mean())
    engine.step()
    engine.save_checkpoint(str(tmp_path / "ck"))
    engine.destroy()
    return tmp_path / "ck"


def test_save_where_chmod_is_refused_completes_and_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from ds.checkpoint import recovery_script

    monkeypatch.setattr(recovery_script, "_chmod_warned", False)  # once per process
    monkeypatch.setattr(os, "chmod", mock.Mock(side_effect=PermissionError(1, "refused")))
    with caplog.at_level(logging.WARNING):
        ckpt = _save(tmp_path, stage=1)
    assert (ckpt / "latest").is_file() and (ckpt / "zero_to_fp32.py").is_file()
    assert "zero_to_fp32.py executable" in caplog.text
    assert cli.main(["verify", str(ckpt)]) == 0


def test_stage0_save_leaves_no_script(tmp_path: Path) -> None:
    # DeepSpeed leaves the script only with its ZeRO (stage 1-3) optimizers.
    ckpt = _save(tmp_path, stage=0)
    assert (ckpt / "latest").is_file() and not (ckpt / "zero_to_fp32.py").exists()
