"""``ds checkpoint export DIR OUT`` does what DeepSpeed's zero_to_fp32.py does, on DeepSpeed and ds
checkpoints: fp32 weights under the parameter names, Hugging Face file names, --max_shard_size
shards with an index, --safe_serialization, -t TAG."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

FIXTURES = Path(__file__).with_name("deepspeed_fixtures")
DS = Path(sys.executable).with_name("ds")


def _deepspeed_whole_weights() -> dict[str, torch.Tensor]:
    """What DeepSpeed itself wrote whole (stage 0 module state, fp32): the reference."""
    tag = (FIXTURES / "stage0_fp32" / "latest").read_text().strip()
    sd = torch.load(
        FIXTURES / "stage0_fp32" / tag / "mp_rank_00_model_states.pt", weights_only=True
    )
    return {k: v.float() for k, v in sd["module"].items()}


def _export(*args: str, subprocess_cli: bool = False) -> None:
    if subprocess_cli:  # the real console script, once
        cmd = [str(DS), "checkpoint", "export", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return
    from ds.checkpoint.cli import main

    assert main(["export", *args]) == 0


@pytest.mark.parametrize(
    "case",
    [pytest.param("stage3_fp32", marks=pytest.mark.slow), "stage2_fp32", "universal_stage2_fp32"],
)
def test_sharded_safetensors_with_index(case: str, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    _export(str(FIXTURES / case), str(out), "--safe_serialization", "--max_shard_size", "300B",
            "-t", "global_step5", subprocess_cli=case == "stage3_fp32")  # fmt: skip
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and all(f.startswith("model-0000") for f in files)
    got: dict[str, torch.Tensor] = {}
    for f in files:
        got.update(load_file(out / f))
    want = _deepspeed_whole_weights()
    assert sorted(got) == sorted(want) == sorted(index["weight_map"])
    for k in want:
        assert got[k].dtype == torch.float32
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-6)
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in want.values())


def test_single_torch_file_from_bf16_masters(tmp_path: Path) -> None:
    _export(str(FIXTURES / "stage3_bf16"), str(tmp_path))
    got = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    ref_tag = (FIXTURES / "stage1_bf16" / "latest").read_text().strip()
    ref = torch.load(
        FIXTURES / "stage1_bf16" / ref_tag / "mp_rank_00_model_states.pt", weights_only=True
    )["module"]
    for k, v in ref.items():  # fp32 masters, within bf16 rounding of DeepSpeed's bf16 weights
        assert got[k].dtype == torch.float32
        torch.testing.assert_close(got[k].bfloat16().float(), v.float(), rtol=0, atol=8e-3)


def test_fp16_checkpoints_export_their_fp32_masters(tmp_path: Path) -> None:
    # Stage 0: DeepSpeed's fp16 optimizer keeps the masters whole (fp32_groups, module order).
    _export(str(FIXTURES / "stage0_fp16"), str(tmp_path / "s0"))
    got = torch.load(tmp_path / "s0" / "pytorch_model.bin", weights_only=True)
    tag = (FIXTURES / "stage0_fp16" / "latest").read_text().strip()
    sd = torch.load(
        FIXTURES / "stage0_fp16" / tag / "mp_rank_00_model_states.pt", weights_only=True
    )
    masters = [t for group in sd["optimizer"]["fp32_groups"] for t in group]
    assert len(masters) == len(sd["module"])
    for (k, v), m in zip(sd["module"].items(), masters, strict=True):
        assert v.dtype == torch.float16 and got[k].dtype == torch.float32
        torch.testing.assert_close(got[k], m.float().reshape(v.shape), rtol=0, atol=0)
    # Stage 3 (fragments on each rank): trained as stage 1 was, whose fp16 weights are whole.
    _export(str(FIXTURES / "stage3_fp16"), str(tmp_path / "s3"))
    got = torch.load(tmp_path / "s3" / "pytorch_model.bin", weights_only=True)
    tag = (FIXTURES / "stage1_fp16" / "latest").read_text().strip()
    ref = torch.load(
        FIXTURES / "stage1_fp16" / tag / "mp_rank_00_model_states.pt", weights_only=True
    )["module"]
    for k, v in ref.items():
        torch.testing.assert_close(got[k].half(), v, rtol=0, atol=1e-3)


def test_ds_checkpoint_exports_the_same_way(tmp_path: Path) -> None:
    from ds.checkpoint.engine import ShardedCheckpointEngine
    from ds.checkpoint.sharding import shard_state

    ts = {
        "module.fc.weight": torch.randn(4, 3).bfloat16(),
        "master.fc.weight": torch.randn(4, 3),
        "optim.exp_avg.fc.weight": torch.randn(4, 3),
        "buffer.running": torch.arange(5.0),
        "frozen.emb.weight": torch.randn(6, 3).bfloat16(),  # requires_grad=False: as saved
    }
    state = shard_state(ts, 0, 1)
    state.objects = {"step": 1}
    ShardedCheckpointEngine().save(str(tmp_path / "ck"), "global_step1", state)
    _export(str(tmp_path / "ck"), str(tmp_path / "out"), "--safe_serialization")
    got = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(got) == ["emb.weight", "fc.weight", "running"]
    torch.testing.assert_close(got["fc.weight"], ts["master.fc.weight"])  # fp32 master, not bf16
    assert torch.equal(got["emb.weight"], ts["frozen.emb.weight"])
    _export(str(tmp_path / "ck"), str(tmp_path / "out2"), "--exclude_frozen_parameters")
    got = torch.load(tmp_path / "out2" / "pytorch_model.bin", weights_only=True)
    assert sorted(got) == ["fc.weight", "running"]


def test_bad_shard_size_is_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ds.checkpoint.cli import main

    args = ["export", str(FIXTURES / "stage2_fp32"), str(tmp_path), "--max_shard_size", "lots"]
    assert main(args) == 2
    assert "5GB, 500MB or 2GiB" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["frozen_stage2_fp32", "frozen_stage3_fp32"])
def test_frozen_parameters_exported_unless_excluded(case: str, tmp_path: Path) -> None:
    """fc1 is frozen in these fixtures: DeepSpeed keeps it apart (whole at stage 2, one fragment
    per rank at stage 3). Untrained, it still holds the seed-1234 initial weights."""
    sys.path.insert(0, str(FIXTURES))
    from deepspeed_fixture_spec import TinyNet

    torch.manual_seed(1234)
    init = TinyNet(freeze_fc1=True).state_dict()
    _export(str(FIXTURES / case), str(tmp_path / "all"), "--safe_serialization")
    got = load_file(tmp_path / "all" / "model.safetensors")
    assert sorted(got) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    for name in ("fc1.weight", "fc1.bias"):
        torch.testing.assert_close(got[name], init[name], rtol=0, atol=0)
    assert not torch.equal(got["fc2.weight"], init["fc2.weight"])  # trained
    _export(str(FIXTURES / case), str(tmp_path / "trainable"), "--safe_serialization",
            "--exclude_frozen_parameters")  # fmt: skip
    assert sorted(load_file(tmp_path / "trainable" / "model.safetensors")) == [
        "fc2.bias",
        "fc2.weight",
    ]
