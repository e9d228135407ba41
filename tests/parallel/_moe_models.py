"""A tiny model with one DeepSpeed-style MoE layer, its batches and the one-process reference."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from _parity import train_alone

# The ranks run as scripts: the suite's support folder is not on their path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from tiny_models import mlp_expert

from ds.parallel.moe import MoE

HIDDEN = 8
EXPERTS = 4
SEQ = 6
MICRO = 2
STEPS = 10
AUX = 0.01
LR = 1e-3
CLIP = 0.5


class Net(torch.nn.Module):
    def __init__(self, k: int, ep_size: int, residual: bool) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(HIDDEN, HIDDEN)
        expert = mlp_expert(HIDDEN)
        # capacity_factor 0.5 with k=1 (0.5 * 2 with k=2) drops tokens at these sizes; token
        # order decides which (use_rts=False) so the reference drops the same ones.
        self.moe = MoE(
            HIDDEN,
            expert,
            num_experts=EXPERTS,
            ep_size=ep_size,
            k=k,
            capacity_factor=0.5,
            min_capacity=1,
            use_residual=residual,
            use_rts=False,
            top2_2nd_expert_sampling=False,
        )
        self.out = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, l_aux, counts = self.moe(torch.tanh(self.inp(x)))
        loss = torch.nn.functional.mse_loss(self.out(h), y) + AUX * l_aux
        return loss, counts


def model(k: int, residual: bool) -> Net:
    """The whole model (every expert), the same on every call."""
    torch.manual_seed(0)
    net = Net(k, 1, residual)
    # Distinct experts (DeepSpeed deep-copies one expert): re-draw each from its global index.
    with torch.no_grad():
        for i, e in enumerate(net.moe.deepspeed_moe.experts.deepspeed_experts.values()):
            g = torch.Generator().manual_seed(100 + i)
            for p in e.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return net


def batch(step: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(rows, SEQ, HIDDEN, generator=g), torch.randn(rows, SEQ, HIDDEN, generator=g)


def reference(k: int, residual: bool, ranks: int) -> dict:
    """One process, all experts: every step each rank's micro-batch is gated on its own (its own
    capacity, its own drops, its own aux loss) and the losses are averaged, as the data-parallel
    ranks' gradients are."""
    torch.set_num_threads(1)
    net = model(k, residual)

    def loss_at(step: int) -> torch.Tensor:
        x, y = batch(step, MICRO * ranks)
        parts = [
            net(x[r * MICRO : (r + 1) * MICRO], y[r * MICRO : (r + 1) * MICRO])[0]
            for r in range(ranks)
        ]
        return torch.stack(parts).mean()

    return train_alone(net, LR, STEPS, CLIP, loss_at)
