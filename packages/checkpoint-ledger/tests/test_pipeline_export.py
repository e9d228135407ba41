"""`ds checkpoint export` on a pipeline checkpoint's layer files (written here by hand in the
layout ds's PipelineEngine and DeepSpeed's write)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ds.checkpoint import cli
from ds.checkpoint.deepspeed_export import entries
from ds.interfaces.errors import CheckpointError


def _pipeline_checkpoint(root: Path) -> dict[str, torch.Tensor]:
    tag = root / "global_step3"
    tag.mkdir(parents=True)
    (root / "latest").write_text("global_step3")
    emb, lin, norm = torch.randn(7, 4), torch.randn(3, 4), torch.ones(3, dtype=torch.bfloat16)
    torch.save({"weight": emb}, tag / "layer_00-model_states.pt")
    torch.save({"weight": lin, "bias": torch.zeros(3)}, tag / "layer_01-model_states.pt")
    torch.save({"weight": norm}, tag / "layer_02-model_states.pt")
    torch.save({"num_stages": 2, "tied_layers": {0: "embed"}}, tag / "pipeline_states.pt")
    return {
        "tied_modules.embed.weight": emb,
        "1.weight": lin,
        "1.bias": torch.zeros(3),
        "2.weight": norm.float(),
    }


def test_layer_files_export_as_one_fp32_model(tmp_path: Path) -> None:
    want = _pipeline_checkpoint(tmp_path / "ck")
    out = tmp_path / "out"
    assert cli.main(["export", str(tmp_path / "ck"), str(out)]) == 0
    got = torch.load(out / "pytorch_model.bin", weights_only=True)
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k].dtype == torch.float32 and torch.equal(got[k], v), k


def test_exclude_frozen_is_refused_in_one_line(tmp_path: Path) -> None:
    _pipeline_checkpoint(tmp_path / "ck")
    with pytest.raises(CheckpointError, match="not supported for pipeline checkpoints"):
        entries(str(tmp_path / "ck"), exclude_frozen=True)


def test_a_truncated_layer_file_is_named(tmp_path: Path) -> None:
    _pipeline_checkpoint(tmp_path / "ck")
    bad = tmp_path / "ck" / "global_step3" / "layer_01-model_states.pt"
    bad.write_bytes(bad.read_bytes()[:40])
    with pytest.raises(CheckpointError, match=r"layer_01-model_states\.pt"):
        entries(str(tmp_path / "ck"))
