"""Train a small LightningModule with a ds strategy on CPU processes.

    python examples/lightning_module.py --strategy ds_zero3 --devices 2 --steps 8

Lightning starts the other processes itself. ``--losses FILE`` writes rank 0's per-step losses as
JSON; ``--save DIR`` writes a checkpoint when training ends; ``--resume DIR`` continues from one.
"""

from __future__ import annotations

import argparse
import json

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

import ds.integrations.lightning  # noqa: F401  (registers the ds_zero* strategies)


class Regressor(pl.LightningModule):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, width), torch.nn.Tanh(), torch.nn.Linear(width, 1)
        )
        self.losses: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.01)


def dataset(n: int = 128) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 16, generator=g)
    y = (x[:, :4].sum(dim=1, keepdim=True) - 0.5 * x[:, 4:5]).tanh()
    return TensorDataset(x, y)


def fit(
    model: pl.LightningModule,
    strategy: object,
    devices: int,
    args: argparse.Namespace,
    resume: str | None = None,
    save: str | None = None,
) -> pl.Trainer:
    """Fit ``model`` with ``strategy`` on ``devices`` CPU processes: ``args.steps`` optimizer
    steps of ``args.accumulate`` batches of ``args.batch`` from ``dataset(args.samples)``, from
    the checkpoint ``resume`` when given, saving one to ``save`` at the end when given."""
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=devices,
        max_steps=args.steps,
        accumulate_grad_batches=args.accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = DataLoader(dataset(args.samples), batch_size=args.batch, shuffle=False)
    trainer.fit(model, loader, ckpt_path=resume)
    if save:
        trainer.save_checkpoint(save)
    return trainer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", default="ds_zero2")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--samples", type=int, default=128)
    p.add_argument("--losses", default=None)
    p.add_argument("--save", default=None)
    p.add_argument("--resume", default=None)
    args = p.parse_args()

    pl.seed_everything(0, verbose=False)
    model = Regressor()
    trainer = fit(model, args.strategy, args.devices, args, args.resume, args.save)
    if args.losses and trainer.is_global_zero:
        with open(args.losses, "w") as f:
            json.dump({"losses": model.losses, "global_step": trainer.global_step}, f)


if __name__ == "__main__":
    main()
