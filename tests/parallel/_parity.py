"""What the parity tests of the gloo worlds share: a worker joining its world as one rank, the
one-process reference run, and the comparison of a sharded run with it."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def join_world(**extra_env: str) -> tuple[int, int, Path]:
    """In a worker started as ``script RANK WORLD PORT OUT ...``: become that rank of a one-host
    world (torch.distributed's environment, rendezvous at 127.0.0.1:PORT, plus ``extra_env``)
    with one intra-op thread; return (rank, world, OUT)."""
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=port,
        **extra_env,
    )
    torch.set_num_threads(1)
    return rank, world, out


def run_scenarios_as_rank(run: Callable[[Any, Any, str, Path], dict], **extra_env: str) -> None:
    """The rank side of ``_ranks_launch.run_scenarios`` (``script RANK WORLD PORT OUT SCENARIO...``):
    join the world, then for each scenario ``run(ds.full, ds.comm, scenario, OUT/<scenario>)``,
    rank 0 saving what it returns as ``result.pt`` in that folder; then leave the world."""
    rank, _, out = join_world(**extra_env)
    import ds.full as ds
    from ds import comm as dist

    for scenario in sys.argv[5:]:
        where = out / scenario.replace(":", "-")
        where.mkdir(parents=True, exist_ok=True)
        result = run(ds, dist, scenario, where)
        if rank == 0:
            torch.save(result, where / "result.pt")
    dist.barrier()
    dist.destroy_process_group()


def world_fixture(
    run: Callable[[int, Path, list[str]], dict[str, dict]], world: int, scenarios: list[str]
) -> Any:
    """The module-scoped fixture ``world<world>``: ``run(world, out, scenarios)``, the results of
    running every scenario on one world of that many ranks."""
    import pytest

    def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
        return run(world, tmp_path_factory.mktemp(f"world{world}"), scenarios)

    return pytest.fixture(scope="module", name=f"world{world}")(results)


def train_alone(
    net: torch.nn.Module, lr: float, steps: int, clip: float, loss_at: Callable[[int], torch.Tensor]
) -> dict:
    """One process training the whole model: torch AdamW without weight decay, gradients clipped
    to ``clip``; the loss and gradient norm (before clipping) of each step, and the weights."""
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0)
    losses, norms = [], []
    for step in range(steps):
        loss = loss_at(step)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), clip)))
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    weights = {k: v.detach().clone() for k, v in net.state_dict().items()}
    return {"losses": losses, "norms": norms, "weights": weights}


def assert_losses_and_norms(got: dict, want: dict) -> None:
    """Every step's loss (1e-5 relative, 1e-6 absolute) and gradient norm (1e-5 relative)."""
    torch.testing.assert_close(
        torch.tensor(got["losses"]), torch.tensor(want["losses"]), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(
        torch.tensor(got["norms"]), torch.tensor(want["norms"]), rtol=1e-5, atol=0
    )


def assert_weight_close(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """The relative error of the whole tensor (norm of the difference over the norm) within 1e-5:
    Adam turns last-bit differences of near-zero gradients into steps of up to lr on single
    elements, so elementwise bounds measure noise."""
    err = float(torch.linalg.vector_norm(got - want))
    assert err <= 1e-5 * float(torch.linalg.vector_norm(want)), f"{name}: relative error {err}"
