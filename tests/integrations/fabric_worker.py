"""Fabric runs of the example regressor, one per strategy in one launch; rank 0 writes losses."""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from lightning.fabric import Fabric
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from lightning_module import Regressor, dataset

import ds.integrations.lightning  # noqa: F401


def run(strategy: str, steps: int, ckpt: str) -> dict:
    fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)
    fabric.launch()
    fabric.seed_everything(0)
    model = Regressor()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    model, opt = fabric.setup(model, opt)
    loader = fabric.setup_dataloaders(DataLoader(dataset(64), batch_size=8, shuffle=False))
    losses: list[float] = []
    while len(losses) < steps:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            fabric.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
            if len(losses) == steps:
                break
    out = {"losses": losses}
    if strategy.startswith("ds_"):
        x, y = next(iter(loader))

        def probe() -> float:
            with torch.no_grad():
                return float(torch.nn.functional.mse_loss(model(x), y))

        out["before_save"] = probe()
        fabric.save(ckpt, {"model": model, "optimizer": opt, "step": len(losses)})
        # One more step moves the weights; loading must bring back the saved ones.
        fabric.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        out["after_extra_step"] = probe()
        state = {"model": model, "optimizer": opt, "step": 0}
        fabric.load(ckpt, state)
        out["restored_step"] = state["step"]
        out["after_load"] = probe()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--strategies", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--out", required=True)
    p.add_argument("--ckpt", required=True)
    args = p.parse_args()
    results = {
        s: run(s, args.steps, os.path.join(args.ckpt, s)) for s in args.strategies.split(",")
    }
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
