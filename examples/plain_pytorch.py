"""A plain PyTorch training loop on ds: ``ds.initialize`` and three engine calls.

    ds run --nproc 2 examples/plain_pytorch.py --stage 2 --steps 20

The engine shards the data (``training_data=``), the optimizer state (ZeRO 1-2) and the parameters
(ZeRO-3); the loop itself is ordinary PyTorch.
"""

from __future__ import annotations

import argparse
import json

import torch

import ds.full as ds
from ds import comm as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--losses", default=None, help="write rank 0's losses here (JSON)")
    p.add_argument("--checkpoint", default=None, help="save a checkpoint here at the end")
    args = p.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
        torch.nn.Linear(64, 1),
    )  # fmt: skip
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 16, generator=g)
    y = torch.tanh(x[:, :4].sum(dim=1, keepdim=True))
    data = torch.utils.data.TensorDataset(x, y)
    config = {
        "train_micro_batch_size_per_gpu": 16,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": args.stage},
        "steps_per_print": 10,
    }
    engine, _, loader, _ = ds.initialize(model=model, config=config, training_data=data)

    losses: list[float] = []
    while len(losses) < args.steps:
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(engine(xb), yb)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
            if len(losses) == args.steps:
                break
    if args.checkpoint:
        engine.save_checkpoint(args.checkpoint)
    if args.losses and dist.get_rank() == 0:
        with open(args.losses, "w") as f:
            json.dump({"losses": losses, "world_size": dist.get_world_size()}, f)
    # Leave together: a rank that exits while another still talks to it aborts the job.
    dist.barrier()
    engine.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
