"""One 2-rank run for the gate tests, with the gate's default thresholds.

argv: scenario out_dir. ``clean``: a plain ZeRO-2 run. ``slow_host``: optimizer offload whose
host Adam step sleeps (the offload term must rise). ``slow_peer``: rank 1 sleeps 0.5 s before each
backward, so rank 0 waits for it in the gradient synchronisation (the wait term must rise and name
rank 1). ``offload``: a plain optimizer-offload run (the test sets ``$DS_MEMORY_LIMIT_FILE``).
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
PEER_SLEEP_S = 0.5  # rank 1, per step
STEPS = 12
# Steps long against the scheduler's time slice: on a loaded 2-core machine a rank descheduled
# for a slice must not look like a slow peer (at 512 rows a step was 8 ms, one slice).
BATCH = 4096
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
model = torch.nn.Sequential(
    torch.nn.Linear(128, 256),
    torch.nn.GELU(),
    torch.nn.Linear(256, 256),
    torch.nn.GELU(),
    torch.nn.Linear(256, 1),
)
config = {
    "train_micro_batch_size_per_gpu": BATCH,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 2},
    "gate": {},  # the defaults: calibrated to pass a healthy run on CPU and GPU alike
    "ledger": {"path": str(out / "ledger.jsonl")},
}
if scenario in ("slow_host", "offload"):
    config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
engine, _, _, _ = ds.initialize(model=model, config=config)
gen = torch.Generator().manual_seed(rank)
for _ in range(STEPS):
    x = torch.randn(BATCH, 128, generator=gen)
    loss = engine(x).pow(2).mean()
    if scenario == "slow_peer" and rank == 1:
        time.sleep(PEER_SLEEP_S)
    engine.backward(loss)
    engine.step()
if rank == 0:
    a = engine.gate.report()
    findings = [f.__dict__ for f in a.findings]
    (out / "assessment.json").write_text(
        json.dumps(
            {"score": a.score, "passed": a.passed, "metrics": dict(a.metrics), "findings": findings}
        )
    )
