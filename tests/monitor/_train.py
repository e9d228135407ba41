"""A 2-rank training run with every monitor and the flops profiler on (launched by ds run)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import ds.full as ds

out = Path(sys.argv[1])
torch.manual_seed(0)


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(32, 16)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(16, 24), torch.nn.GELU(), torch.nn.Linear(24, 32)
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.mlp(self.emb(ids))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.roll(-1, 1).flatten())


config = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
    "zero_optimization": {"stage": 2},
    "tensorboard": {"enabled": True, "output_path": str(out / "tb"), "job_name": "job"},
    "csv_monitor": {"enabled": True, "output_path": str(out / "csv"), "job_name": "job"},
    "wandb": {"enabled": True, "project": "ds-test"},
    "comet": {"enabled": True, "online": False, "project": "ds-test", "samples_log_interval": 1},
    "flops_profiler": {
        "enabled": True,
        "profile_step": 2,
        "module_depth": -1,
        "top_modules": 2,
        "output_file": str(out / "flops.txt"),
    },
}
engine, _, _, _ = ds.initialize(model=Tiny(), config=config)
losses = []
gen = torch.Generator().manual_seed(engine.rank)
for _ in range(4):
    ids = torch.randint(0, 32, (2, 8), generator=gen)
    loss = engine(ids)
    engine.backward(loss)
    engine.step()
    losses.append(engine._last_metrics.loss)
if engine.rank == 0:
    (out / "losses.json").write_text(json.dumps(losses))
if engine.monitor is not None:
    engine.monitor.close()
