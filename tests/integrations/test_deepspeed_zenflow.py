"""``deepspeed`` ZenFlow names: the selective optimizer is ds.ops', the config section is ds's
``zero_optimization.zenflow`` model, and the core split keeps both sides non-empty."""

from __future__ import annotations

import pytest


def test_zenflow_names_map_onto_ds() -> None:
    from ds.full.compat.deepspeed.ops import adam
    from ds.full.compat.deepspeed.runtime.zenflow.zenflow_config import ZenFlowConfig
    from ds.full.compat.deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from ds.ops.optim import SelectiveAdamW, SelectiveAdamWPartitioned

    assert adam.ZenFlowSelectiveAdamW is SelectiveAdamW
    assert adam.ZenFlowSelectiveAdamW_stage3 is SelectiveAdamWPartitioned
    cfg = DeepSpeedZeroConfig(stage=2, zenflow={"topk_ratio": 0.3, "update_interval": 4})
    assert isinstance(cfg.zenflow, ZenFlowConfig) and cfg.zenflow.update_interval == 4


@pytest.mark.parametrize(
    ("cores", "perc", "zf", "pt"),
    [
        ([0, 1, 2, 3], 0.5, [2, 3], [0, 1]),
        ([4, 5, 6], 0.1, [5, 6], [4]),
        ([0, 1], 0.0, [0, 1], [0, 1]),
    ],
)
def test_split_affinity(cores: list[int], perc: float, zf: list[int], pt: list[int]) -> None:
    from ds.full.compat.deepspeed.runtime.zenflow.zenflow_utils import _split_affinity

    assert _split_affinity(cores, perc) == (zf, pt)
