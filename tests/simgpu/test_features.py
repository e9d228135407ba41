"""Activation checkpointing and ``ds.zero.Init`` on eight simulated GPUs."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch
from _world import DIM, DTYPES, MLP, WORLD, config, device_syncs, train

import ds.full as ds
from ds.sim.world import RankContext, run_world

pytestmark = [pytest.mark.simgpu, pytest.mark.slow]


def test_activation_checkpointing_recomputes_on_the_device() -> None:
    cfg = config(2, "bf16")
    cfg["activation_checkpointing"] = {"partition_activations": False}
    result = train(cfg, model=partial(MLP, checkpointed=True))
    assert result.values() == [2] * WORLD
    assert len(device_syncs(result)) <= 2


def _init_body(ctx: RankContext, *, steps: int) -> Any:
    from ds.zero import Init

    cfg = config(3, "bf16")
    ds.init_distributed()  # as a script does before zero.Init: selects the rank's device
    with Init(comm=ctx.comm, config_dict_or_path=cfg):
        model = MLP()
    shards = {str(p.ds_shard.shard.device) for p in model.parameters()}
    if not steps:
        return shards
    made = [id(p.ds_shard) for p in model.parameters()]
    engine, *_ = ds.initialize(model=model, config=cfg)
    kept = [id(p.ds_shard) for p in engine.module.parameters()] == made
    for _ in range(steps * engine.gradient_accumulation_steps()):
        x = torch.randn(2, DIM).to(DTYPES["bf16"]).to(ctx.device)
        engine.backward(engine(x))
        engine.step()
    engine.destroy()
    return shards, kept, engine.global_steps


def test_zero_init_builds_shards_on_the_ranks_device() -> None:
    result = run_world(partial(_init_body, steps=0), WORLD)
    for rank, shards in enumerate(result.values()):
        assert shards == {f"cuda:{rank}"}


def test_zero_init_model_trains_at_stage3() -> None:
    # The bf16 cast must keep the shards ds.zero.Init made (Module.to swaps fake tensors whole,
    # dropping their attributes, and stage 3 then took the empty parameters for whole ones).
    result = run_world(partial(_init_body, steps=1), WORLD)
    for rank, (shards, kept, steps) in enumerate(result.values()):
        assert shards == {f"cuda:{rank}"} and kept and steps == 1


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_checkpoint_save_and_load_on_the_device(stage: int) -> None:
    cfg = config(stage, "bf16")
    cfg["gradient_accumulation_steps"] = 1

    def body(ctx: RankContext) -> Any:
        engine, *_ = ds.initialize(model=MLP(), config=cfg)

        def one_step() -> None:
            x = torch.randn(2, DIM).to(DTYPES["bf16"]).to(ctx.device)
            engine.backward(engine(x))
            engine.step()

        one_step()
        engine.save_checkpoint("/sim/ckpt", tag="a")
        one_step()
        path, _ = engine.load_checkpoint("/sim/ckpt", tag="a")
        one_step()  # the loaded state trains on, on the device
        steps = engine.global_steps
        engine.destroy()
        return path, steps, {str(p.device) for p in engine.module.parameters()}

    result = run_world(body, WORLD)
    for rank, (path, steps, devices) in enumerate(result.values()):
        assert path is not None and steps == 2 and devices == {f"cuda:{rank}"}
