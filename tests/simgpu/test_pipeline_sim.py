"""Pipeline parallelism PP=2 x DP=4 on eight simulated GPUs: placement and NCCL discipline.

GPipe and 1F1B. The interleaved schedule sends activations both ways between two stages (stage 1
feeds stage 0's second chunk), and the simulated world runs its ranks one after another, so the
receiver of a shape header would run before its sender: its NCCL stream order is not checked here
(its numbers are, on gloo, by tests/pipeline).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

import ds.full as ds
from ds.sim.world import RankContext, run_world

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))
from _pipe_gpt import SEQ, VOCAB, pipeline_module

pytestmark = pytest.mark.simgpu

WORLD, PP, MICRO, GAS = 8, 2, 2, 4


def _body(schedule: str, stage: int, ctx: RankContext) -> Any:
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GAS,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
        "pipeline": {"stages": PP, "schedule": schedule},
    }
    net = pipeline_module(PP)
    engine, *_ = ds.initialize(model=net, config=cfg)
    for _ in range(2):
        ids = torch.randint(0, VOCAB, (MICRO, SEQ)).to(ctx.device)
        engine.train_batch(iter([(ids, ids)] * GAS))
    devices = {str(p.device) for p in engine.module.parameters()}
    mesh = engine.mesh
    # Stage timings from device events (the host clock would time launches on a GPU).
    assert engine.runner.uses_device_events
    assert len(engine.last_metrics.stage_compute_s) == PP
    out = devices, mesh.index("pp"), mesh.shape.dp, engine.global_steps
    engine.destroy()
    return out


@pytest.mark.parametrize(("schedule", "stage"), [("gpipe", 0), ("1f1b", 1), ("1f1b", 0)])
def test_pp2_x_dp4_places_and_orders_collectives(schedule: str, stage: int) -> None:
    result = run_world(partial(_body, schedule, stage), WORLD)  # checks the ranks' collectives
    stages = set()
    for rank, (devices, pp_index, dp, steps) in enumerate(result.values()):
        assert devices == {f"cuda:{rank}"} and dp == WORLD // PP and steps == 2
        stages.add(pp_index)
    assert stages == {0, 1}
    for rank in range(WORLD):
        traffic = result.world.traffic(rank)
        assert traffic.get("send", 0) + traffic.get("recv", 0) > 0, traffic
