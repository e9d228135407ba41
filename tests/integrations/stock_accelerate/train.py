"""A stock accelerate script with DeepSpeed's plugin, as users write it: no ds import at all.

    ds run --nproc 2 train.py --output_dir OUT

``Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config="ds_config.json"))``, then the usual
prepare / backward / step loop. With DeepSpeed installed it trains with DeepSpeed; with
``ds compat enable`` and no DeepSpeed, the ``deepspeed`` API accelerate reaches is served by ds.
"""

import argparse
import json
import os

import torch
from accelerate import Accelerator, DeepSpeedPlugin
from accelerate.utils import InitProcessGroupKwargs
from torch.utils.data import DataLoader, TensorDataset

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 6


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def make_data():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4 * STEPS, 8, generator=g)
    return TensorDataset(x, torch.randn(4 * STEPS, 4, generator=g))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--output_dir", required=True)
    cli = p.parse_args()
    plugin = DeepSpeedPlugin(hf_ds_config=os.path.join(HERE, "ds_config.json"))
    # On a machine without GPUs accelerate picks no process-group backend by itself (and cpu=True
    # turns DeepSpeed off): naming gloo is how an accelerate + DeepSpeed script runs on CPUs.
    gloo = InitProcessGroupKwargs(backend="gloo")
    accelerator = Accelerator(deepspeed_plugin=plugin, kwargs_handlers=[gloo])
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    loader = DataLoader(make_data(), batch_size=2, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach().clone(), reduction="mean").item())
    if accelerator.is_main_process:
        os.makedirs(cli.output_dir, exist_ok=True)
        with open(os.path.join(cli.output_dir, "result.json"), "w") as f:
            json.dump(
                {
                    "losses": losses,
                    "engine": type(model).__module__ + "." + type(model).__name__,
                    "world": accelerator.num_processes,
                },
                f,
            )


if __name__ == "__main__":
    main()
