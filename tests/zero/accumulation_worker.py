"""One rank of the accumulation-window checks (``accumulation_worker.py RANK WORLD PORT OUT_DIR``).

For every ZeRO stage: an unmanaged engine (``managed_gradient_accumulation: false``) trained on
windows of different lengths, and an engine whose windows run inside
``coalesce_grad_reduction()`` next to one running the same passes without it. Every rank also
trains plain PyTorch on the whole world's micro-batches; rank 0 saves everything for the test.
"""

from __future__ import annotations

import copy
import itertools
import sys
from pathlib import Path
from typing import Any

import torch

from ds.interfaces import registry
from ds.zero.engine import ZeroEngine
from ds.zero.engine_accumulation import AccumulationConfigError

MICRO = 2
LR = 1e-2
# Adam divides by sqrt(v) + eps: a small eps turns rounding noise in a near-zero gradient into
# a visible update difference, which would hide real differences behind luck.
EPS = 1e-4
WINDOWS = (2, 3, 1)  # backward passes per unmanaged step
COALESCED = 3  # backward passes per coalesced step
STEPS = 2


def model() -> torch.nn.Module:
    """A 8-16-16-4 tanh MLP, the same weights every call."""
    torch.manual_seed(0)
    widths = (8, 16, 16, 4)
    layers: list[torch.nn.Module] = []
    for n_in, n_out in itertools.pairwise(widths):
        layers += [torch.nn.Linear(n_in, n_out), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def micro(k: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * k + rank)
    return torch.randn(MICRO, 8, generator=g), torch.randn(MICRO, 4, generator=g)


def config(stage: int, managed: bool, **zero: Any) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "managed_gradient_accumulation": managed,
        "optimizer": {"type": "Adam", "params": {"lr": LR, "eps": EPS}},
        # Small buckets: several reductions per backward.
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 200, **zero},
    }


def loss_of(m: Any, k: int, rank: int) -> torch.Tensor:
    x, y = micro(k, rank)
    return torch.nn.functional.mse_loss(m(x), y)


def reference(windows: list[list[int]], world: int, per_window_mean: bool) -> dict[str, Any]:
    """Plain PyTorch: one Adam step per window on the ranks' mean loss, summed over the window's
    micro-batches (divided by their count when ``per_window_mean``)."""
    m = model()
    opt = torch.optim.Adam(m.parameters(), lr=LR, eps=EPS)
    for window in windows:
        opt.zero_grad()
        total = sum(sum(loss_of(m, k, r) for r in range(world)) / world for k in window)
        (total / len(window) if per_window_mean else total).backward()
        opt.step()
    return m.state_dict()


class Counted:
    """Counts the gradient reductions a communicator is asked for."""

    def __init__(self, comm: Any) -> None:
        self.calls = 0
        for name in ("all_reduce", "reduce", "reduce_scatter_tensor"):
            setattr(comm, name, self._wrap(getattr(comm, name)))

    def _wrap(self, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return fn(*args, **kwargs)

        return counted


def reductions(engine: ZeroEngine, counted: Counted) -> int:
    """Gradient reductions so far: stage 3's own count (its host path reduces point to point),
    else the communicator's."""
    if engine.zero_optimization_stage() == 3:
        return int(engine.strategy.partitioner.grads.reduced)
    return counted.calls


def unmanaged(stage: int, rank: int, world: int, comm: Any) -> dict[str, Any]:
    engine = ZeroEngine(model(), config(stage, managed=False), comm=comm)
    windows, k, samples, applied = [], 0, [], []
    for n in WINDOWS:
        window = list(range(k, k + n))
        k += n
        for i in window:
            engine.backward(loss_of(engine, i, rank) / n, scale_wrt_gas=False)
        engine.step()
        windows.append(window)
        samples.append(engine.global_samples)
        applied.append(engine.was_step_applied())
    return {
        "got": copy.deepcopy(engine.module.state_dict()),
        "want": reference(windows, world, per_window_mean=True),
        "samples": samples,
        "applied": applied,
    }


def coalesced(stage: int, rank: int, world: int, comm: Any, counted: Counted) -> dict[str, Any]:
    together = ZeroEngine(model(), config(stage, managed=True), comm=comm)
    apart = ZeroEngine(model(), config(stage, managed=True), comm=comm)
    windows, inside = [], []
    for step in range(STEPS):
        window = list(range(step * COALESCED, (step + 1) * COALESCED))
        windows.append(window)
        before = reductions(together, counted)
        with together.coalesce_grad_reduction():
            for j, i in enumerate(window):
                together.set_gradient_accumulation_boundary(j == len(window) - 1)
                together.backward(loss_of(together, i, rank))
            inside.append(reductions(together, counted) - before)
        after = reductions(together, counted) - before
        together.step()
        for j, i in enumerate(window):
            apart.set_gradient_accumulation_boundary(j == len(window) - 1)
            apart.backward(loss_of(apart, i, rank))
        apart.step()
    return {
        "got": copy.deepcopy(together.module.state_dict()),
        "apart": copy.deepcopy(apart.module.state_dict()),
        "want": reference(windows, world, per_window_mean=False),
        "inside": inside,
        "reduced_on_exit": after,
    }


def refused_everywhere(comm: Any) -> bool:
    """Every rank refuses the same config before any collective, so none waits on another."""
    try:
        ZeroEngine(model(), config(1, managed=False, overlap_comm=True), comm=comm)
    except AccumulationConfigError:
        comm.barrier()  # both ranks got here: nothing is left waiting
        return True
    return False


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    torch.set_num_threads(1)
    comm = registry.get(registry.COMM_BACKENDS, "torch")()
    comm.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank, world, 120.0)
    counted = Counted(comm)
    result: dict[str, Any] = {"refused": refused_everywhere(comm)}
    for stage in (0, 1, 2, 3):
        result[f"unmanaged{stage}"] = unmanaged(stage, rank, world, comm)
        result[f"coalesced{stage}"] = coalesced(stage, rank, world, comm, counted)
    if rank == 0:
        torch.save(result, out / "accumulation.pt")
    comm.barrier()
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
