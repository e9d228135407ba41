"""A DeepSpeed-format checkpoint directory whose ``latest`` file or tag leaves the directory
(``../x/global_step5``, an absolute path) is refused as ds's own format refuses it: by the loader,
by ``ds checkpoint export`` in both forms, and before the mutation boundary is asked, so a load
never reads, and never skips the approval of, a checkpoint outside the directory it was given.
The refusal is an operator error (exit code 2), distinct from a damaged checkpoint (1)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ds.checkpoint import MutationBoundary, RunLedger, ShardedCheckpointEngine
from ds.checkpoint._format import CheckpointPathError
from ds.checkpoint._recovery import require_load
from ds.interfaces.checkpoint import LoadRequest
from ds.interfaces.errors import ApprovalRequiredError, CheckpointError

FIXTURES = Path(__file__).with_name("deepspeed_fixtures")
DS = Path(sys.executable).with_name("ds")


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """``run/`` (an empty run directory) whose ``latest`` names a real DeepSpeed checkpoint in a
    sibling folder; ``run/global_step5`` is the same checkpoint inside the directory."""
    outside = tmp_path / "outside"
    shutil.copytree(FIXTURES / "stage2_fp32", outside)
    run = tmp_path / "run"
    run.mkdir()
    (run / "latest").write_text("../outside/global_step5\n")
    return run


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(DS), "checkpoint", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_export_refuses_a_latest_or_tag_leaving_the_directory(planted: Path) -> None:
    out = planted.parent / "exported"
    outside_tag = str(planted.parent / "outside" / "global_step5")
    cases = [
        ([], "(named by"),  # the latest file
        (["--tag", "../outside/global_step5"], "'../outside/global_step5'"),
        (["--tag", outside_tag], repr(outside_tag)),
    ]
    for extra, named in cases:
        proc = _cli("export", str(planted), str(out), *extra)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        err = proc.stderr.strip()
        assert "\n" not in err and named in err and "not usable as a directory name" in err, err
        assert "global_step100" in err  # the fix
        if not extra:
            assert str(planted / "latest") in err
    proc = _cli("export", str(planted), "--to", "safetensors", "--out", str(out / "m.st"),
                "--tag", outside_tag)  # fmt: skip
    assert proc.returncode == 2 and "not usable as a directory name" in proc.stderr, proc.stderr
    assert not out.exists() or not any(out.iterdir())


def test_load_refuses_before_the_boundary_is_asked(planted: Path, tmp_path: Path) -> None:
    """With a ledger, a load inside the directory needs an approval; a planted ``latest`` used
    to skip it (the tag error was swallowed) and load the outside checkpoint."""
    req = [LoadRequest("module.fc1.weight", 0, 4)]
    with RunLedger(str(tmp_path / "l.jsonl")) as led:
        eng = ShardedCheckpointEngine(ledger=led, boundary=MutationBoundary(led))
        with pytest.raises(CheckpointError, match=r"named by .*latest.* not usable") as err:
            eng.load(str(planted), None, req)
        assert not isinstance(err.value, ApprovalRequiredError)
        # The boundary check itself refuses (on every rank alike), not only the read after it.
        with pytest.raises(CheckpointPathError, match=r"'\.\./outside/global_step5'"):
            require_load(eng, str(planted), "../outside/global_step5", req)
        with pytest.raises(CheckpointError, match="not usable as a directory name"):
            eng.metadata(str(planted), "../outside/global_step5")
        with pytest.raises(CheckpointError, match="not usable"):
            eng.latest_tag(str(planted))
        # The same checkpoint inside the directory is read only with the approval.
        shutil.copytree(planted.parent / "outside" / "global_step5", planted / "global_step5")
        (planted / "latest").write_text("global_step5\n")
        with pytest.raises(ApprovalRequiredError, match="load_checkpoint"):
            eng.load(str(planted), None, req)
    no_ledger = ShardedCheckpointEngine()
    got = no_ledger.load(str(planted), None, req).tensors["module.fc1.weight"].local
    assert got.numel() == 4 and got.dtype == torch.float32
    (planted / "latest").write_text(str(planted / "global_step5"))  # absolute, even if inside
    with pytest.raises(CheckpointError, match="not usable as a directory name"):
        no_ledger.load(str(planted), None, req)


def test_deepspeed_reader_refuses_traversal_tags(planted: Path) -> None:
    from ds.checkpoint.deepspeed_format import DeepSpeedCheckpoint, is_deepspeed_checkpoint

    for tag in ("../outside/global_step5", str(planted.parent / "outside" / "global_step5")):
        with pytest.raises(CheckpointError, match="not usable as a directory name"):
            is_deepspeed_checkpoint(str(planted), tag)
        with pytest.raises(CheckpointError, match="not usable as a directory name"):
            DeepSpeedCheckpoint(str(planted), tag)


def test_engine_load_checkpoint_refuses_a_planted_latest(planted: Path, tmp_path: Path) -> None:
    """``engine.load_checkpoint(DIR)`` of a ds.initialize run with a ledger: the planted latest
    is refused and the weights stay as they were."""
    import sys

    import ds.full as ds

    sys.path.insert(0, str(FIXTURES))
    try:
        from deepspeed_fixture_spec import TinyNet, config
    finally:
        sys.path.remove(str(FIXTURES))
    torch.manual_seed(4321)
    model = TinyNet()
    cfg = {**config(2, "fp32", 6), "ledger": {"path": str(tmp_path / "run.jsonl")}}
    engine, *_ = ds.initialize(model=model, config=cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with pytest.raises(CheckpointPathError, match=r"\.\./outside/global_step5"):
            engine.load_checkpoint(str(planted))
        for k, v in model.state_dict().items():
            assert torch.equal(v, before[k]), k
    finally:
        engine.ledger.close()
