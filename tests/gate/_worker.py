"""One 2-rank run for the gate tests: clean, a slow host optimizer step, or a slow peer.

argv: scenario out_dir. ``slow_host`` wraps the cpu kernel provider so every Adam step on the
host sleeps (the offload term must rise); ``slow_peer`` makes rank 1 sleep before each backward,
so rank 0 waits in the gradient all-reduce (the sync term must rise).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

import ds.full as ds
from ds.interfaces import registry

scenario, out = sys.argv[1], Path(sys.argv[2])
SLEEP_S = 0.25  # per host Adam step
PEER_SLEEP_S = 0.6  # rank 1, per micro-step
rank = int(os.environ.get("RANK", "0"))

if scenario == "slow_host":
    base = registry.get(registry.KERNELS, "cpu")

    class SlowHost:
        """The real cpu provider, its Adam step made slow."""

        def __init__(self) -> None:
            self._k = base()

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(self._k, name)

        def adam_step(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            time.sleep(SLEEP_S)
            return self._k.adam_step(*args, **kwargs)

    registry.register(registry.KERNELS, "cpu", lambda: SlowHost)

torch.manual_seed(0)
# Compute-heavy, parameter-light: collectives are a small share of a clean step.
model = torch.nn.Sequential(
    torch.nn.Linear(128, 256),
    torch.nn.GELU(),
    torch.nn.Linear(256, 256),
    torch.nn.GELU(),
    torch.nn.Linear(256, 1),
)
config = {
    "train_micro_batch_size_per_gpu": 2048,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 1},
    "gate": {"ddi_max": 10.0, "baseline_steps": 3, "window": 20, "p99_step_latency_s_max": 30.0},
    "ledger": {"path": str(out / "ledger.jsonl")},
}
if scenario == "slow_host":
    config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
engine, _, _, _ = ds.initialize(model=model, config=config)
gen = torch.Generator().manual_seed(rank)
for _ in range(8):
    x = torch.randn(2048, 128, generator=gen)
    loss = engine(x).pow(2).mean()
    if scenario == "slow_peer" and rank == 1:
        time.sleep(PEER_SLEEP_S)
    engine.backward(loss)
    engine.step()
if rank == 0:
    a = engine.gate.report()
    (out / "assessment.json").write_text(
        json.dumps({"score": a.score, "passed": a.passed, "metrics": dict(a.metrics)})
    )
