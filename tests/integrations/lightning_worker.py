"""Several Lightning fits in one launch (Lightning starts the second process once, and both
processes run every fit in turn): ``--strategies ddp,ds_zero2 --out FILE`` writes rank 0's losses
per strategy. ``--save DIR``/``--resume DIR`` checkpoint each strategy's run in ``DIR/<strategy>``."""

from __future__ import annotations

import argparse
import json
import os
import sys

import lightning.pytorch as pl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from lightning_module import Regressor, fit

import ds.integrations.lightning


class ConfigOptimizerRegressor(Regressor):
    def configure_optimizers(self) -> None:  # type: ignore[override]
        return None  # the strategy's config defines the optimizer


def strategy_for(name: str) -> object:
    """``ds_zero2_config_optimizer``: the optimizer comes from the ds config, not the module."""
    if name == "ds_zero2_config_optimizer":
        opt = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}
        return ds.integrations.lightning.DsStrategy(stage=2, config={"optimizer": opt})
    return name


def fit_one(strategy: str, args: argparse.Namespace, resume: str | None, save: str | None) -> dict:
    pl.seed_everything(0, verbose=False)
    model = ConfigOptimizerRegressor() if strategy.endswith("config_optimizer") else Regressor()
    trainer = fit(model, strategy_for(strategy), 2, args, resume, save)
    return {"losses": model.losses, "global_step": trainer.global_step}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--strategies", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--accumulate", type=int, default=2)
    p.add_argument("--save", default=None)
    p.add_argument("--resume", default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    names = args.strategies.split(",")
    out = {}
    for name in names:
        resume = os.path.join(args.resume, name) if args.resume else None
        save = os.path.join(args.save, name) if args.save else None
        out[name] = fit_one(name, args, resume, save)
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        with open(args.out, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
