"""A training script written for DeepSpeed, kept as such: run through ds's ``deepspeed`` shim."""

import argparse
import json

import deepspeed
import deepspeed.comm as dist
import torch
from deepspeed.accelerator import get_accelerator


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(12, 24)
        self.fc2 = torch.nn.Linear(24, 1)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--ckpt", required=True)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 12, generator=g)
    data = torch.utils.data.TensorDataset(x, x[:, :3].sum(dim=1, keepdim=True))

    with deepspeed.zero.Init():
        model = Net()
    engine, _optimizer, loader, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), training_data=data
    )
    losses = []
    for _ in range(3):
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(engine(xb), yb)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    engine.save_checkpoint(args.ckpt, client_state={"epoch": 3})
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        shapes = [list(p.shape) for p in engine.module.parameters()]
        total = float(sum(p.detach().double().sum() for p in engine.module.parameters()))
    _, client = engine.load_checkpoint(args.ckpt)
    dist.barrier()
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "losses": losses,
                    "shapes": shapes,
                    "param_sum": total,
                    "client": client,
                    "world_size": dist.get_world_size(),
                    "stage": engine.zero_optimization_stage(),
                    "global_steps": engine.global_steps,
                    # the engine attributes DeepSpeed scripts read
                    "local_rank": engine.local_rank,
                    "global_rank": engine.global_rank,
                    "dp_world_size": engine.dp_world_size,
                    "device": str(engine.device),
                    "was_step_applied": engine.was_step_applied(),
                    "mom": engine.get_mom(),
                    "steps_per_print": engine.steps_per_print(),
                },
                f,
            )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
