"""``zero_to_fp32.py``: the consolidation script a checkpoint engine leaves beside ``latest``.

The copy in the save folder is run as a script (``runpy``, ``__main__``) with DeepSpeed's
arguments and must write what ``ds checkpoint export DIR OUTPUT_DIR`` writes; the tags beside it
still verify, inspect and load; a missing ds is one line saying what to install.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ds.checkpoint import cli, recovery_script
from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.sharding import full_requests, shard_state
from ds.interfaces.checkpoint import RecoveryScriptWriter


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {
        "module.a.weight": torch.randn(64, 32, generator=g),
        "module.a.bias": torch.randn(64, generator=g),
        "module.b.weight": torch.randn(16, 64, generator=g),
        "frozen.emb.weight": torch.randn(10, 4, generator=g),
    }


def _saved(tmp_path: Path) -> tuple[ShardedCheckpointEngine, Path]:
    eng = ShardedCheckpointEngine()
    ck = tmp_path / "ck"
    for tag in ("global_step1", "global_step2"):
        eng.save(str(ck), tag, shard_state(_weights(), 0, 1))
    assert isinstance(eng, RecoveryScriptWriter)
    eng.write_recovery_script(str(ck))
    return eng, ck


def _run_copy(ck: Path, *args: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """``python zero_to_fp32.py ARGS`` in the checkpoint folder, in this interpreter."""
    monkeypatch.chdir(ck)
    monkeypatch.setattr(sys, "argv", ["zero_to_fp32.py", *args])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path("zero_to_fp32.py", run_name="__main__")
    return int(exit_.value.code or 0)


def test_the_copy_is_the_packaged_script_and_executable(tmp_path: Path) -> None:
    _, ck = _saved(tmp_path)
    script = ck / "zero_to_fp32.py"
    src = Path(recovery_script.__file__).with_name("zero_to_fp32.py")
    assert script.read_bytes() == src.read_bytes()
    assert script.read_bytes().startswith(b"#!/usr/bin/env python\n")
    assert os.stat(script).st_mode & 0o100
    assert sorted(os.listdir(ck)) == ["global_step1", "global_step2", "latest", "zero_to_fp32.py"]


def test_script_writes_what_ds_checkpoint_export_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, ck = _saved(tmp_path)
    args = ["-t", "global_step1", "--safe_serialization", "--max_shard_size", "10KB",
            "--exclude_frozen_parameters"]  # fmt: skip
    assert _run_copy(ck, ".", "out", *args, monkeypatch=monkeypatch) == 0
    assert "wrote" in capsys.readouterr().out
    assert cli.main(["export", str(ck), str(tmp_path / "ref"), *args]) == 0
    got, ref = ck / "out", tmp_path / "ref"
    names = sorted(os.listdir(got))
    assert names == sorted(os.listdir(ref)) and "model.safetensors.index.json" in names
    index = json.loads((got / "model.safetensors.index.json").read_text())
    assert sorted(index["weight_map"]) == ["a.bias", "a.weight", "b.weight"]  # no frozen.emb
    for name in names:
        if name.endswith(".safetensors"):
            a, b = load_file(str(got / name)), load_file(str(ref / name))
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # The default output: one pytorch_model.bin holding every weight, frozen ones too.
    assert _run_copy(ck, ".", "bin", monkeypatch=monkeypatch) == 0
    sd = torch.load(ck / "bin" / "pytorch_model.bin", weights_only=True)
    for key, t in _weights().items():
        assert torch.equal(sd[key.partition(".")[2]], t), key


def test_tags_beside_the_script_verify_inspect_and_load(tmp_path: Path) -> None:
    eng, ck = _saved(tmp_path)
    assert eng.verify(str(ck)) == []
    assert cli.main(["verify", str(ck)]) == 0
    assert cli.main(["inspect", str(ck)]) == 0
    got = eng.load(str(ck), None, full_requests(eng.metadata(str(ck)).values()))
    assert all(torch.equal(got.tensors[k].local, t.reshape(-1)) for k, t in _weights().items())


def test_errors_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, ck = _saved(tmp_path)
    assert _run_copy(ck, ".", "out", "-t", "global_step9", monkeypatch=monkeypatch) == 1
    assert capsys.readouterr().err.startswith("error: ")
    monkeypatch.setitem(sys.modules, "ds.checkpoint.deepspeed_export", None)  # ds not installed
    assert _run_copy(ck, ".", "out", monkeypatch=monkeypatch) == 1
    err = capsys.readouterr().err
    assert "this script needs ds installed: pip install ds-checkpoint-ledger" in err


def test_refused_chmod_leaves_the_script_and_warns_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(recovery_script, "_chmod_warned", False)
    monkeypatch.setattr(os, "chmod", refuse)
    with caplog.at_level("WARNING", logger="ds.checkpoint.recovery_script"):
        for _ in range(3):  # every save rewrites it; one warning per process
            path = recovery_script.write_recovery_script(str(tmp_path / "ck"))
    assert Path(path).read_bytes().startswith(b"#!")
    assert not os.stat(path).st_mode & 0o100
    assert len([r for r in caplog.records if "executable" in r.getMessage()]) == 1
