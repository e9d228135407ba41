"""The shim's checkpoint names: file listing and naming, the recorded parallel degrees, and
loading a universal checkpoint entry into a ZeRO-1/2 parameter's fragment."""

from __future__ import annotations

import types
from pathlib import Path

import torch


def test_file_names_and_listing(tmp_path: Path) -> None:
    from ds.full.compat.deepspeed.checkpoint.utils import (
        get_model_ckpt_name_for_rank,
        get_zero_ckpt_name_for_rank,
    )
    from ds.full.compat.deepspeed.utils.zero_to_fp32 import get_optim_files

    assert get_model_ckpt_name_for_rank("d", "01") == "d/mp_rank_01_model_states.pt"
    assert get_zero_ckpt_name_for_rank("d", 3, 1) == "d/zero_pp_rank_3_mp_rank_01_optim_states.pt"
    for rank in (10, 2, 1):
        (tmp_path / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_text("")
    assert [Path(f).name.split("_")[3] for f in get_optim_files(str(tmp_path))] == ["1", "2", "10"]


def test_parallel_degrees_recorded_from_the_mpu() -> None:
    from ds.full.compat.deepspeed.runtime.engine import _checkpoint_parallel_metadata

    mpu = types.SimpleNamespace(
        get_pipe_parallel_world_size=lambda: 2, get_slice_parallel_world_size=lambda: 4
    )
    dims = _checkpoint_parallel_metadata(mpu)["checkpoint_parallel_dimensions"]
    assert dims == {"pp_degree": 2, "tp_degree": 4}
    assert _checkpoint_parallel_metadata(None)["checkpoint_parallel_dimensions"]["tp_degree"] == 1


def test_universal_entry_loads_into_a_row_parallel_fragment(tmp_path: Path) -> None:
    from ds.full.compat.deepspeed.checkpoint import enable_universal_checkpoint

    full = torch.arange(32.0).view(4, 8)
    torch.save({"param": full, "cat_dim": 1}, tmp_path / "fp32.pt")
    torch.save({"param": full * 2, "cat_dim": 1}, tmp_path / "exp_avg.pt")
    param = torch.nn.Parameter(torch.zeros(4, 4))
    hp = torch.zeros(16)
    param._hp_mapping = types.SimpleNamespace(
        lp_fragment_address=types.SimpleNamespace(start=0, numel=16), get_hp_fragment=lambda: hp
    )
    enable_universal_checkpoint([param])
    assert param.load_hp_checkpoint_state(str(tmp_path), tp_rank=1, tp_world_size=2) is None
    assert torch.equal(hp, full[:, 4:].flatten())
    assert torch.equal(param._hp_mapping.optim_fragment["exp_avg"], full[:, 4:].flatten() * 2)


def test_bf16_optimizer_wrapper_is_refused_with_the_config_to_use() -> None:
    import pytest

    from ds.full.compat.deepspeed._missing import FeatureNotAvailableError
    from ds.full.compat.deepspeed.runtime.bf16_optimizer import BF16_Optimizer

    with pytest.raises(FeatureNotAvailableError, match=r"bf16\.enabled"):
        BF16_Optimizer(None)


def test_runtime_zero_names_the_parameter_status() -> None:
    from ds.full.compat.deepspeed.runtime import zero
    from ds.full.compat.deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    assert zero.ZeroParamStatus is ZeroParamStatus


def test_zero3_elastic_checkpoint_warns_it_has_no_effect(monkeypatch: object) -> None:
    from ds.full.compat.deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from ds.full.compat.deepspeed.utils import logger

    said: list[str] = []
    monkeypatch.setattr(logger, "warning", lambda msg, *a, **k: said.append(msg))  # type: ignore[attr-defined]
    DeepSpeedZeroConfig(stage=2, elastic_checkpoint=True)
    assert not said
    DeepSpeedZeroConfig(stage=3, elastic_checkpoint=True)
    assert len(said) == 1 and "universal checkpoint" in said[0]
