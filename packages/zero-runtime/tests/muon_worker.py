"""One rank of the Muon ZeRO parity test: ``muon_worker.py RANK WORLD PORT OUT_DIR``.

Trains a small MLP with Muon at ZeRO stages 0, 1 and 2 on a gloo world (each rank its half of
every batch); rank 0 also steps the single-process Muon on the whole batches and saves both."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ds.interfaces import registry
from ds.zero.engine import ZeroEngine
from ds.zero.optim.muon import Muon, muon_param_groups

STEPS, MICRO = 4, 3
PARAMS = {"lr": 0.02, "adam_lr": 1e-3, "weight_decay": 0.01, "ns_method": "gram"}


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    # Odd sizes: partitions cut matrices mid-row, one matrix tall, one wide.
    return torch.nn.Sequential(
        torch.nn.Linear(7, 13), torch.nn.Tanh(), torch.nn.Linear(13, 5), torch.nn.Tanh(),
        torch.nn.Linear(5, 3),
    )


def batch(step: int, n: int) -> torch.Tensor:
    return torch.randn(n, 7, generator=torch.Generator().manual_seed(100 + step))


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    comm = registry.get(registry.COMM_BACKENDS, "torch")()
    comm.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank, world, 120.0)
    results = {}
    for stage in (0, 1, 2):
        cfg = {
            "train_micro_batch_size_per_gpu": MICRO,
            "optimizer": {"type": "Muon", "params": PARAMS},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 20,
                                  "allgather_bucket_size": 40},
        }
        engine = ZeroEngine(model(), cfg, comm=comm)
        for step in range(STEPS):
            x = batch(step, MICRO * world)[rank * MICRO : (rank + 1) * MICRO]
            engine.backward(engine(x).square().mean())
            engine.step()
        results[stage] = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
        engine.destroy()
    if rank == 0:
        ref = model()
        names = {id(p): n for n, p in ref.named_parameters()}
        opt = Muon(muon_param_groups([{"params": list(ref.parameters())}], PARAMS, names))
        for step in range(STEPS):
            opt.zero_grad()
            ref(batch(step, MICRO * world)).square().mean().backward()
            opt.step()
        results["ref"] = {n: p.detach().clone() for n, p in ref.named_parameters()}
        torch.save(results, out / "muon.pt")
    comm.barrier()


if __name__ == "__main__":
    main()
