"""``ds.initialize(model=PipelineModule)``: 10 steps of a tiny GPT (tied embedding / LM head) at
PP=2 and PP=2 x DP=2 with each schedule equal one process training the whole model on the whole
batch with torch's AdamW and clipping (fp32; losses, norms and weights within 1e-5)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "parallel"))  # the gloo world launcher and parity checks

from _parity import (  # noqa: E402
    assert_losses_and_norms,
    assert_weight_close,
    train_alone,
    world_fixture,
)
from _pipe_gpt import batch, loss_fn, pipeline_module  # noqa: E402
from _pipe_worker import GAS, MICRO, STEPS, config  # noqa: E402
from _ranks_launch import run_scenarios  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def _world(world: int, out: Path, scenarios: list[str]) -> dict[str, dict]:
    return run_scenarios(HERE / "_pipe_worker.py", world, out, scenarios, 280)


def _reference(dp: int, **module_kw: object) -> dict:
    """One process, the whole model, the step's whole batch: torch AdamW and clipping."""
    torch.set_num_threads(1)
    net = pipeline_module(1, **module_kw)
    params = config("1f1b", 0)["optimizer"]["params"]

    def loss_at(step: int) -> torch.Tensor:
        ids = batch(step, MICRO * GAS * dp)
        return loss_fn(net(ids), ids)

    run = train_alone(net, params["lr"], STEPS, 0.5, loss_at)
    with torch.no_grad():
        ids = batch(STEPS, MICRO * GAS * dp)
        evaluation = float(loss_fn(net(ids), ids))
    return {**run, "eval": evaluation}


def _resumed(first: dict, world: int, out: Path, scenario: str) -> dict:
    """``scenario`` at ``world`` ranks from the checkpoint ``first`` saved, joined to ``first``:
    the whole run as one record (losses and norms of both, the second's weights and eval)."""
    os.environ["DS_TEST_CKPT"] = str(first["dir"] / "ckpt")
    try:
        second = _world(world, out, [scenario])[scenario]
    finally:
        del os.environ["DS_TEST_CKPT"]
    return {
        "losses": first["losses"] + second["losses"],
        "norms": first["norms"] + second["norms"],
        "weights": second["weights"],
        "eval": second["eval"],
    }


def _assert_same(got: dict, want: dict) -> None:
    # Clipping is active (the norm is above 0.5 at the start): the norm adds every stage once
    # and the tied embedding once.
    assert want["norms"][0] > 0.5
    assert_losses_and_norms(got, want)
    assert got["eval"] == pytest.approx(want["eval"], rel=1e-5)
    assert set(got["weights"]) == set(want["weights"])
    for name, w in want["weights"].items():
        assert_weight_close(name, got["weights"][name], w)


# schedule:zero_stage[:flag]
WORLD2 = ["gpipe:0:export", "1f1b:1", "interleaved_1f1b:1:ckpt", "1f1b:0:deepspeed"]
WORLD4 = ["gpipe:1", "1f1b:0", "interleaved_1f1b:1"]


world2 = world_fixture(_world, 2, WORLD2)
world4 = world_fixture(_world, 4, WORLD4)


@pytest.fixture(scope="module")
def reference() -> dict[int, dict]:
    return {1: _reference(1), 2: _reference(2)}


@pytest.mark.parametrize("scenario", WORLD2)
def test_pp2_matches_one_process(world2: dict, reference: dict, scenario: str) -> None:
    _assert_same(world2[scenario], reference[1])


@pytest.mark.slow
@pytest.mark.parametrize("scenario", WORLD4)
def test_pp2_x_dp2_matches_one_process(world4: dict, reference: dict, scenario: str) -> None:
    _assert_same(world4[scenario], reference[2])


def test_every_rank_gets_the_batch_loss(world2: dict) -> None:
    for scenario in WORLD2:
        first, *others = world2[scenario]["loss_on_every_rank"]
        assert all(o == first for o in others)


def test_step_metrics_report_the_bubble(world2: dict) -> None:
    for scenario, chunks in zip(WORLD2, (1, 1, 2, 1)):
        for measured, formula, stage_s in world2[scenario]["bubbles"]:
            # (p - 1) / (v * m + p - 1) with p = 2 stages, m = GAS micro-batches
            assert formula == pytest.approx(1 / (chunks * GAS + 1))
            assert 0.0 <= measured < 1.0 and len(stage_s) == 2 and min(stage_s) > 0


def test_save_16bit_model_writes_one_whole_model(world2: dict, reference: dict) -> None:
    result = world2["gpipe:0:export"]
    exported = torch.load(result["dir"] / "export" / "pytorch_model.bin", weights_only=True)
    # named as the one-stage model names it: it loads into one directly
    net = pipeline_module(1)
    net.load_state_dict(exported)
    assert set(exported) == set(reference[1]["weights"])
    for name, w in result["weights"].items():
        torch.testing.assert_close(exported[name], w, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("fmt", ["torch", "safetensors", "zero_to_fp32.py"])
def test_ds_checkpoint_export_writes_one_model_from_a_pp2_checkpoint(
    world2: dict, tmp_path: Path, fmt: str
) -> None:
    # The PP=2 interleaved run's checkpoint (four layer files per stage, a tied embedding / LM
    # head saved once) through the documented command, and through the zero_to_fp32.py its
    # ZeRO-1 save left beside `latest` (run as DeepSpeed's users run it).
    saved = world2["interleaved_1f1b:1:ckpt"]
    out = tmp_path / "export"
    cmd = [sys.executable, "-m", "ds.launcher", "checkpoint", "export", str(saved["dir"] / "ckpt")]
    if fmt == "zero_to_fp32.py":
        cmd = [sys.executable, str(saved["dir"] / "ckpt" / fmt), str(saved["dir"] / "ckpt")]
    cmd += [str(out)] + (["--safe_serialization"] if fmt == "safetensors" else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if fmt == "safetensors":
        from safetensors.torch import load_file

        exported = load_file(str(out / "model.safetensors"))
    else:
        exported = torch.load(out / "pytorch_model.bin", weights_only=True)
    pipeline_module(1).load_state_dict(exported)  # named as the one-stage model names it
    assert set(exported) == set(saved["weights"])
    for name, w in saved["weights"].items():
        torch.testing.assert_close(exported[name], w.float(), rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_pp2_checkpoint_loads_at_pp1_and_back(world2: dict, tmp_path: Path) -> None:
    # The per-layer files saved by two stages load into one stage holding every layer (other
    # initial weights), and a one-stage checkpoint loads into two stages.
    saved = world2["interleaved_1f1b:1:ckpt"]
    ckpt = saved["dir"] / "ckpt"
    files = sorted(p.name for p in ckpt.rglob("layer_*-model_states.pt"))
    assert files == [f"layer_{i:02d}-model_states.pt" for i in range(6)]  # the head is tied
    os.environ["DS_TEST_CKPT"] = str(ckpt)
    try:
        one = _world(1, tmp_path / "one", ["gpipe:1:load", "1f1b:1:ckpt"])
        os.environ["DS_TEST_CKPT"] = str(one["1f1b:1:ckpt"]["dir"] / "ckpt")
        two = _world(2, tmp_path / "two", ["1f1b:1:load"])
    finally:
        del os.environ["DS_TEST_CKPT"]
    for got, want in ((one["gpipe:1:load"], saved), (two["1f1b:1:load"], one["1f1b:1:ckpt"])):
        assert set(got["weights"]) == set(want["weights"])
        for name, w in want["weights"].items():
            torch.testing.assert_close(got["weights"][name], w, rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_pp2_checkpoint_continues_exactly_at_pp1_and_back(reference: dict, tmp_path: Path) -> None:
    # Five steps at PP=2 (ZeRO-1), saved; the last five at PP=1 from it; and PP=2 x DP=2 through
    # its gathered ZeRO-1 partitions: each equals one process training all ten (weights and Adam
    # moments resharded per parameter). PP=1 -> PP=2 takes the same per-layer files the other
    # way: test_pp2_checkpoint_loads_at_pp1_and_back loads them.
    for first_world, second_world in ((2, 1), (4, 4)):
        want = reference[2 if first_world == 4 else 1]
        out = tmp_path / f"{first_world}to{second_world}"
        first = _world(first_world, out / "a", ["1f1b:1:half"])["1f1b:1:half"]
        _assert_same(_resumed(first, second_world, out / "b", "1f1b:1:resume"), want)
