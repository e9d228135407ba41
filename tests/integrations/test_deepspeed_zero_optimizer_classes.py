"""``deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer`` and
``stage3.DeepSpeedZeroOptimizer_Stage3``: ``isinstance`` tells the ZeRO stage of the optimizer
``deepspeed.initialize`` returns; DeepSpeed's memory estimates keep its formulae."""

from __future__ import annotations

import pytest
import torch

from ds.full.compat import deepspeed
from ds.full.compat.deepspeed._missing import FeatureNotAvailableError
from ds.full.compat.deepspeed.runtime.zero import stage3, stage_1_and_2
from ds.full.compat.deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
from ds.full.compat.deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer


@pytest.mark.parametrize(("stage", "z12", "z3"), [(0, False, False), (1, True, False),
                                                  (2, True, False), (3, False, True)])  # fmt: skip
def test_isinstance_tells_the_stage(stage: int, z12: bool, z3: bool) -> None:
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}  # fmt: skip
    engine, optimizer, _, _ = deepspeed.initialize(model=torch.nn.Linear(4, 2), config=cfg)
    assert isinstance(optimizer, DeepSpeedZeroOptimizer) is z12
    assert isinstance(engine.optimizer, DeepSpeedZeroOptimizer_Stage3) is z3
    assert isinstance(optimizer, torch.optim.Optimizer)  # still a real optimizer
    assert not isinstance(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1),
                          DeepSpeedZeroOptimizer)  # fmt: skip


def test_classes_refuse_construction_and_estimates_match_deepspeeds() -> None:
    with pytest.raises(FeatureNotAvailableError, match=r"zero_optimization\.stage"):
        DeepSpeedZeroOptimizer(None)
    # DeepSpeed 0.19.8's formulae: stage 2 without offload 2P + 18P/N on the device, 4P x gpus x
    # 1.5 on the host; stage 3 without offload 4L + 18P/N, host 4L x gpus x 1.5 (zero_init)
    p, layer = 1_000_000, 10_000
    assert stage_1_and_2.estimate_zero2_model_states_mem_needs(p, 2, 1, False) == (
        12_000_000,
        11_000_000,
    )
    assert stage3.estimate_zero3_model_states_mem_needs(p, layer, 2, 1, False, False) == (
        120_000, 40_000 + 9_000_000, 40_000,
    )  # fmt: skip
    with pytest.raises(AttributeError, match=r"stage_1_and_2\.no_such"):
        stage_1_and_2.no_such  # noqa: B018
