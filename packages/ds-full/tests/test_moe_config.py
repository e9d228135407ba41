"""``ds.initialize`` with mixture-of-experts: bad combinations fail in one line naming the numbers
and the fix; a one-process MoE model trains."""

from __future__ import annotations

import pytest
import torch

import ds.full as ds
from ds.interfaces.errors import ConfigError
from ds.parallel.moe import MoE


def _config(stage: int = 1, **extra: object) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": stage},
        **extra,
    }


class _Net(torch.nn.Module):
    def __init__(self, ep_size: int = 1) -> None:
        super().__init__()
        self.moe = MoE(4, torch.nn.Linear(4, 4), num_experts=2, ep_size=ep_size, min_capacity=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, l_aux, _ = self.moe(x)
        return out.square().mean() + 0.01 * l_aux


def test_expert_parallel_on_a_dense_model_names_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"model has no MoE layers.*remove the expert_parallel"):
        ds.initialize(
            model=torch.nn.Linear(4, 4), config=_config(expert_parallel={"enabled": True})
        )


def test_ep_size_must_divide_the_data_parallel_size() -> None:
    with pytest.raises(ConfigError, match=r"ep_size=2 does not divide the data-parallel size 1"):
        ds.initialize(model=_Net(ep_size=2), config=_config())
    with pytest.raises(ConfigError, match=r"ep_size=2 does not divide the data-parallel size 1"):
        ds.initialize(
            model=_Net(), config=_config(expert_parallel={"enabled": True, "autoep_size": 2})
        )


def test_autoep_size_must_divide_the_experts() -> None:
    from ds.interfaces.moe import ReplicaGroup
    from ds.parallel.moe.autoep import ExpertParallelExperts
    from ds.parallel.moe.groups import ExpertGroups

    class Fused(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_up_proj = torch.nn.Parameter(torch.zeros(4, 6, 3))
            self.down_proj = torch.nn.Parameter(torch.zeros(4, 3, 3))
            self.act_fn = torch.nn.SiLU()

    groups = ExpertGroups(3, None, (0, 1, 2), 0, ReplicaGroup("ep_size_3", None, (0,)))
    with pytest.raises(ConfigError, match=r"autoep_size=3 does not divide the model's 4 experts"):
        ExpertParallelExperts(Fused(), None, groups)


def test_stage3_with_experts_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"stage=3 with mixture-of-experts.*use stage 0, 1 or 2"):
        ds.initialize(model=_Net(), config=_config(stage=3))


def test_one_process_moe_trains_with_its_own_expert_group() -> None:
    torch.manual_seed(0)
    engine, _, _, _ = ds.initialize(model=_Net(), config=_config(expert_parallel={"enabled": True}))
    groups = engine.optimizer.param_groups
    assert len(groups) == 2  # dense parameters, then the experts in a group of their own
    experts = set(map(id, engine.module.moe.deepspeed_moe.experts.parameters()))
    assert {id(p) for p in engine.strategy.groups[1].flat.params} == experts
    x = torch.randn(2, 3, 4)
    losses = []
    for _ in range(5):
        loss = engine(x)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]


def test_deepspeeds_moe_parameter_groups_are_kept() -> None:
    from ds.parallel.moe import split_params_into_different_moe_groups_for_optimizer

    torch.manual_seed(0)
    net = _Net()
    groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": list(net.parameters()), "name": "all", "lr": 1e-2}
    )
    engine, _, _, _ = ds.initialize(model=net, model_parameters=groups, config=_config())
    seen = [(g.get("name"), g.get("moe", False)) for g in engine.optimizer.param_groups]
    assert seen == [("all", False), ("ep_size_1", True)]
    loss = engine(torch.randn(2, 3, 4))
    engine.backward(loss)
    engine.step()
