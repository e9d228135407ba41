"""Every rank of a simulated 8-GPU node trains on its own device: ds.initialize moves the CPU
model to cuda:LOCAL_RANK (the simulated accelerator refuses a set_device to any other index)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.simgpu, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _no_process_group() -> None:
    """Earlier tests in this process may have made a real (gloo) group; the simulation makes its
    own world and refuses to start beside one."""
    from ds import comm

    if comm.is_initialized():
        comm.destroy_process_group()


CFG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "steps_per_print": 10**6,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 0},
}


def test_each_rank_lands_on_its_local_rank_device() -> None:
    import ds.full as ds
    from ds.sim.world import RankContext, run_world

    def train(ctx: RankContext) -> tuple[str, set[str]]:
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))  # on the CPU
        engine, *_ = ds.initialize(model=model, config=CFG)
        x = torch.randn(2, 8, device=ctx.device)
        engine.backward(engine(x).sum())
        engine.step()
        return ctx.accelerator.current_device_name(), {
            str(p.device) for p in engine.module.parameters()
        }

    result = run_world(train, world_size=8)
    for rank, (current, devices) in enumerate(result.values()):
        assert current == f"cuda:{rank}"
        assert devices == {f"cuda:{rank}"}


def test_a_model_split_between_host_and_device_is_named() -> None:
    import ds.full as ds
    from ds.interfaces.errors import ConfigError
    from ds.sim.world import RankContext, run_world

    def build(ctx: RankContext) -> str:
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
        model[0].to(ctx.device)
        with pytest.raises(ConfigError) as err:
            ds.initialize(model=model, config=CFG)
        return str(err.value)

    for rank, msg in enumerate(run_world(build, world_size=2).values()):
        assert f"'1.weight' is on cpu but '0.weight' is on cuda:{rank}" in msg
