"""Converting checkpoints DeepSpeed wrote (tests/checkpoint/deepspeed_fixtures) to its universal
layout: every parameter's fp32 value survives, and ds's own reader loads the result."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ds.checkpoint.deepspeed_format import consolidated_fp32_state_dict
from ds.full.compat.deepspeed.checkpoint.ds_to_universal import main

FIXTURES = Path(__file__).with_name("deepspeed_fixtures")


@pytest.mark.parametrize("case", ["stage1_fp16", "stage2_bf16", "stage3_fp32"])
def test_deepspeed_checkpoint_converts_to_universal(tmp_path: Path, case: str) -> None:
    out = tmp_path / "global_step5_universal"
    main(
        SimpleNamespace(
            input_folder=str(FIXTURES / case / "global_step5"),
            output_folder=str(out),
            inject_missing_state=True,
        )
    )
    expected = consolidated_fp32_state_dict(str(FIXTURES / case))
    got = consolidated_fp32_state_dict(str(tmp_path), "global_step5_universal")
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        assert torch.equal(got[name].float(), value.float()), name
    assert (out / "zero" / "optimizer_state.pt").is_file()
    assert (tmp_path / "latest_universal").read_text() == out.name


def test_ds_checkpoint_universal_verb(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ds.checkpoint.cli import main as cli

    out = tmp_path / "step5_universal"
    assert cli(["universal", str(FIXTURES / "stage2_bf16"), str(out)]) == 2
    assert "--inject-missing-state" in capsys.readouterr().err
    assert not out.exists()  # a refused conversion leaves no half-written checkpoint
    out.mkdir()  # a directory the user made stays, with a warning
    assert cli(["universal", str(FIXTURES / "stage2_bf16"), str(out)]) == 2
    assert out.is_dir() and "may hold a partial conversion" in capsys.readouterr().err
    assert (
        cli(["universal", str(FIXTURES / "stage3_bf16"), str(out), "--inject-missing-state"]) == 0
    )
    got = consolidated_fp32_state_dict(str(tmp_path), out.name)
    expected = consolidated_fp32_state_dict(str(FIXTURES / "stage3_bf16"))
    assert all(torch.equal(got[n], v.float()) for n, v in expected.items())
