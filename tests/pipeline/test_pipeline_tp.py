"""Pipeline x tensor parallelism: PP=2 x TP=2 at world 4 (each stage's blocks split by AutoTP
over its two TP ranks) trains as one process training the whole model on the whole batch (fp32,
10 steps: losses, norms, eval loss and weights within 1e-5), and its checkpoint (one file per
layer and TP rank) continues exactly at the same layout and at PP=1 x TP=1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _pipe_gpt import TPBlock, pipeline_module  # noqa: E402
from test_pipeline_parity import _assert_same, _reference, _resumed, _world  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(600)]

# schedule:zero_stage:flags ("tp": tensor_parallel.autotp_size 2)
WORLD4 = ["gpipe:0:tp:export", "1f1b:1:tp", "interleaved_1f1b:1:tp", "1f1b:1:tp:half"]


@pytest.fixture(scope="module")
def pp2_tp2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return _world(4, tmp_path_factory.mktemp("pp2tp2"), WORLD4)


@pytest.fixture(scope="module")
def reference() -> dict:
    return _reference(1, block=TPBlock)


@pytest.mark.parametrize("scenario", WORLD4[:3])
def test_pp2_x_tp2_matches_one_process(pp2_tp2: dict, reference: dict, scenario: str) -> None:
    _assert_same(pp2_tp2[scenario], reference)
    first, *others = pp2_tp2[scenario]["loss_on_every_rank"]
    assert all(o == first for o in others)


def test_pp2_x_tp2_checkpoint_writes_a_file_per_layer_and_tp_rank(pp2_tp2: dict) -> None:
    ckpt = pp2_tp2["1f1b:1:tp:half"]["dir"] / "ckpt"
    names = {p.name for p in ckpt.rglob("layer_*")}
    # six layers (the LM head is tied to layer 0), two TP slices each, weights and optimizer
    kinds = ("model", "optim")
    assert names == {
        f"layer_{i:02d}-model_{t:02d}-{k}_states.pt"
        for i in range(6)
        for t in (0, 1)
        for k in kinds
    }


def test_pp2_x_tp2_save_16bit_model_writes_one_whole_model(pp2_tp2: dict) -> None:
    result = pp2_tp2["gpipe:0:tp:export"]
    exported = torch.load(result["dir"] / "export" / "pytorch_model.bin", weights_only=True)
    pipeline_module(1, block=TPBlock).load_state_dict(exported)  # whole, one-stage names
    for name, w in result["weights"].items():
        torch.testing.assert_close(exported[name], w, rtol=0, atol=0, msg=name)


def test_ds_checkpoint_export_joins_the_tp_files(pp2_tp2: dict, tmp_path: Path) -> None:
    saved = pp2_tp2["1f1b:1:tp:half"]
    cmd = [sys.executable, "-m", "ds.launcher", "checkpoint", "export", str(saved["dir"] / "ckpt")]
    proc = subprocess.run(cmd + [str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exported = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    pipeline_module(1, block=TPBlock).load_state_dict(exported)
    assert set(exported) == set(saved["weights"])
    for name, w in saved["weights"].items():
        torch.testing.assert_close(exported[name], w, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("world", [4, 1])
def test_pp2_x_tp2_checkpoint_continues_exactly(
    pp2_tp2: dict, reference: dict, tmp_path: Path, world: int
) -> None:
    # Five steps at PP=2 x TP=2 (ZeRO-1), saved; the last five at the same layout, and at one
    # process (PP=1 x TP=1: the TP slices of weights and Adam moments joined per parameter).
    flag = "tp" if world == 4 else "tpblock"
    got = _resumed(pp2_tp2["1f1b:1:tp:half"], world, tmp_path, f"1f1b:1:{flag}:resume")
    _assert_same(got, reference)
