"""Checkpoints saved by DeepSpeed 0.19.8 load into ds and training continues as DeepSpeed's does.

The fixtures (tests/checkpoint/deepspeed_fixtures, made by tools/make_deepspeed_fixtures.py under a
real DeepSpeed on CPU, 2 ranks) hold ZeRO stage 0-3 x {fp32, bf16, fp16} checkpoints (fp16 with
its dynamic loss scale) and a universal one, each with DeepSpeed's own 10-step continuation from
it. ds loads each at world 1 and 3 (saved at 2) and must continue the same way: within 1e-5 in
fp32 (losses, learning rates, final weights).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).with_name("deepspeed_fixtures")
WORKER = Path(__file__).with_name("_deepspeed_worker.py")
DS = Path(sys.executable).with_name("ds")
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.json").exists())
# (loss, weight) tolerances against DeepSpeed's continuation. fp16 training at this learning rate
# drifts by its rounding: DeepSpeed's own stage-0 and stage-1 continuations (the same arithmetic)
# differ by 1.8e-2 in loss over the 10 steps, so fp16 is held to the first steps (see the test)
# and to that drift afterwards.
TOLERANCE = {"fp32": (1e-5, 1e-5), "bf16": (5e-3, 2e-2), "fp16": (6e-2, 5e-2)}
# Saved at one ZeRO stage, loaded into another ds stage: the continuation does not change.
CROSS_STAGE = ["stage1_fp32@3", "stage3_fp32@0", "universal_stage2_fp32@1", "stage3_bf16@2",
               "stage2_fp16@3"]  # fmt: skip


def _expected(case: str) -> dict:
    return json.loads((FIXTURES / case / "expected.json").read_text())


def test_fixtures_are_real_deepspeed_checkpoints() -> None:
    assert len(CASES) >= 8, CASES
    for case in CASES:
        exp = _expected(case)
        assert exp["deepspeed_version"] == "0.19.8" and exp["saved_world_size"] == 2
    total = sum(f.stat().st_size for f in FIXTURES.rglob("*") if f.is_file())
    assert total < 3 * 2**20, f"fixtures are {total} bytes; keep them tiny"


def _run(world: int, tmp_path: Path) -> dict:
    out = tmp_path / f"world{world}.json"
    cmd = [str(DS), "run", "--nproc", str(world), str(WORKER), str(out)]
    cmd += [str(FIXTURES / c) for c in CASES] + [str(FIXTURES / c) for c in CROSS_STAGE]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=560)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [1, 3])
def test_continuation_matches_deepspeed(world: int, tmp_path: Path) -> None:
    got = _run(world, tmp_path)
    assert sorted(got) == sorted(CASES + CROSS_STAGE)
    for case in CASES + CROSS_STAGE:
        exp, g = _expected(case.partition("@")[0]), got[case]
        assert g["global_steps_loaded"] == 5, case
        assert g["global_steps"] == exp["global_steps"] == 15, case
        assert g["client_state"] == exp["client_state"], case
        # fp32: DeepSpeed's own continuation within 1e-5. bf16: the bf16 rounding of the weights
        # (ds's module weights are bf16; DeepSpeed's recorded ones its fp32 masters).
        tol_loss, tol_w = TOLERANCE[exp["precision"]]
        torch.testing.assert_close(g["lrs"], exp["lrs"], rtol=0, atol=1e-12, msg=case)
        if exp["precision"] == "fp16":
            # The dynamic loss scale continues from the saved one (64 at the checkpoint, the
            # config's initial 16 otherwise) and moves as DeepSpeed's does.
            assert g["loss_scale_loaded"] == exp["loss_scale_loaded"] == 64.0, case
            assert g["loss_scale"] == exp["loss_scale"], case
            # The first steps show the load itself: the first loss depends only on the loaded
            # fp16 weights, the second also on the fp32 masters and Adam moments.
            torch.testing.assert_close(g["losses"][0], exp["losses"][0], rtol=0, atol=1e-4)
            torch.testing.assert_close(g["losses"][1], exp["losses"][1], rtol=0, atol=5e-3)
        torch.testing.assert_close(g["losses"], exp["losses"], rtol=0, atol=tol_loss, msg=case)
        for name, want in exp["params"].items():
            torch.testing.assert_close(
                torch.tensor(g["params"][name]), torch.tensor(want), rtol=0, atol=tol_w,
                msg=f"{case} {name}",
            )  # fmt: skip


def test_stage3_partitions_reassemble_to_deepspeeds_whole_weights() -> None:
    """Stage 3 keeps only per-rank pieces of each parameter; stage 0 saves them whole. Both runs
    trained identically in fp32, so the reassembled stage-3 (and 1-2, universal) weights and
    moments must equal what DeepSpeed wrote whole at stage 0."""
    from ds.checkpoint.deepspeed_format import DeepSpeedCheckpoint

    whole = DeepSpeedCheckpoint(str(FIXTURES / "stage0_fp32"))
    ref = {n: t.read(0, t.meta.numel) for n, t in whole.tensors.items()}
    for case in [c for c in CASES if c.endswith("fp32") and c != "stage0_fp32"]:
        ck = DeepSpeedCheckpoint(str(FIXTURES / case))
        assert set(ref) <= set(ck.tensors), case
        for n, want in ref.items():
            t = ck.tensors[n]
            assert t.meta.shape == whole.tensors[n].meta.shape
            torch.testing.assert_close(t.read(0, t.meta.numel), want, rtol=0, atol=1e-6)
            # a partial range crossing the 2-rank partition boundary reads the same elements
            lo, hi = t.meta.numel // 3, t.meta.numel - 1
            torch.testing.assert_close(t.read(lo, hi - lo), want[lo:hi], rtol=0, atol=1e-6)


def test_objects_map_onto_the_engine() -> None:
    from ds.checkpoint.deepspeed_format import DeepSpeedCheckpoint

    ck = DeepSpeedCheckpoint(str(FIXTURES / "stage2_bf16"))
    o = ck.objects
    assert o["global_steps"] == 5 and o["global_samples"] == 30 and o["micro_steps"] == 5
    assert o["lr_scheduler"] == {"last_batch_iteration": 4}
    assert o["client_state"] == {"epoch": 2, "note": "stage2_bf16"}
    assert o["optimizer.scalar_state"] == [{"step": 5}]
    assert o["optimizer.param_groups"][0]["betas"] == (0.9, 0.999)
    assert ck.tensors["master.fc1.weight"].meta.dtype == "float32"
    assert ck.tensors["module.fc1.weight"].meta.dtype == "bfloat16"


def test_unsupported_layout_is_one_line_naming_what_was_found(tmp_path: Path) -> None:
    from ds.checkpoint.deepspeed_format import DeepSpeedCheckpoint
    from ds.interfaces.errors import CheckpointError

    ckpt = tmp_path / "tp2"
    shutil.copytree(FIXTURES / "stage1_fp32", ckpt)
    tag = (ckpt / "latest").read_text().strip()
    src = ckpt / tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    shutil.copy(src, ckpt / tag / "zero_pp_rank_0_mp_rank_01_optim_states.pt")
    shutil.copy(
        ckpt / tag / "mp_rank_00_model_states.pt", ckpt / tag / "mp_rank_01_model_states.pt"
    )
    with pytest.raises(CheckpointError) as err:
        DeepSpeedCheckpoint(str(ckpt))
    msg = str(err.value)
    assert "\n" not in msg
    assert "tensor/model-parallel degree 2" in msg and "Nothing was loaded" in msg
    assert "ZeRO stages 0-3" in msg  # what is supported

    (ckpt / tag / "mp_rank_01_model_states.pt").unlink()
    (ckpt / tag / "zero_pp_rank_0_mp_rank_01_optim_states.pt").unlink()
    (ckpt / tag / "layer_01-model_00-model_states.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"pipeline parallelism \(1 layer_"):
        DeepSpeedCheckpoint(str(ckpt))


def test_deepspeed_objects_load_inert(tmp_path: Path) -> None:
    """DeepSpeed's classes inside its pickles (loss scaler, enums, fragment addresses) become
    inert records: weights-only loading, no DeepSpeed code (or any code) runs."""
    from ds.checkpoint.deepspeed_format import InertRecord, load_file

    tag = (FIXTURES / "stage2_bf16" / "latest").read_text().strip()
    sd = load_file(
        str(FIXTURES / "stage2_bf16" / tag / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")
    )
    osd = sd["optimizer_state_dict"]
    assert isinstance(osd["loss_scaler"], InertRecord) and osd["loss_scaler"].cur_scale == 1.0
    assert int(osd["zero_stage"]) == 2
    # an arbitrary global that is not DeepSpeed's is refused
    evil = tmp_path / "evil.pt"
    torch.save({"x": os.getcwd}, evil)
    from ds.interfaces.errors import CheckpointError

    with pytest.raises(CheckpointError, match=r"evil\.pt holds an object ds will not unpickle"):
        load_file(str(evil))
