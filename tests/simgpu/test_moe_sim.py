"""Expert parallelism EP=4 x DP=2 on eight simulated GPUs: placement and NCCL discipline."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tiny_models import mlp_expert

import ds.full as ds
from ds.parallel.moe import MoE
from ds.sim.world import RankContext, run_world

pytestmark = pytest.mark.simgpu

WORLD, EP, EXPERTS, HIDDEN, SEQ, MICRO = 8, 4, 8, 16, 6, 2


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(HIDDEN, HIDDEN)
        expert = mlp_expert(HIDDEN)
        # drop_tokens keeps the capacity a function of the shapes alone: the fake tensors carry
        # no values for a data-dependent capacity.
        self.moe = MoE(HIDDEN, expert, num_experts=EXPERTS, ep_size=EP, k=2, min_capacity=1)
        self.out = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, l_aux, _ = self.moe(torch.tanh(self.inp(x)))
        return self.out(h).float().pow(2).mean() + 0.01 * l_aux


def _body(stage: int, ctx: RankContext) -> Any:
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
        "expert_parallel": {"enabled": True},
    }
    # Built on the rank's device: Module.to cannot move fake parameters that carry a weak
    # reference, as the MoE layer's deep-copied experts do.
    with ctx.device:
        net = Net()
    net.moe.bind(ctx.comm)
    engine, *_ = ds.initialize(model=net, config=cfg)
    for _ in range(2):
        x = torch.randn(MICRO, SEQ, HIDDEN).to(torch.bfloat16).to(ctx.device)
        engine.backward(engine(x))
        engine.step()
    devices = {str(p.device) for p in engine.module.parameters()}
    experts = sum(1 for n, _ in engine.module.named_parameters() if "deepspeed_experts" in n)
    engine.destroy()
    return devices, experts, engine.global_steps


@pytest.mark.parametrize("stage", [1, 2])
def test_ep4_x_dp2_places_and_orders_collectives(stage: int) -> None:
    from functools import partial

    result = run_world(partial(_body, stage), WORLD)  # checks every rank's collectives agree
    for rank, (devices, experts, steps) in enumerate(result.values()):
        assert devices == {f"cuda:{rank}"} and steps == 2
        assert experts == 4 * (EXPERTS // EP)  # this rank's 2 experts, 2 linears x (w, b) each
    for rank in range(WORLD):
        assert result.world.traffic(rank).get("all_to_all_single", 0) > 0
