"""Activation checkpointing: identical losses and gradients with it on and off, in every mode."""

from __future__ import annotations

import copy

import pytest
import torch
from _stage3 import stage3
from torch import nn

from ds.zero import activation_checkpointing as checkpointing


class Net(nn.Module):
    def __init__(self, ckpt: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.Dropout(0.2), nn.Linear(24, 12))
            for _ in range(3)
        )
        self.ckpt = ckpt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + (checkpointing.checkpoint(layer, x) if self.ckpt else layer(x))
        return x.pow(2).mean()


MODES = [
    {},
    {"cpu_checkpointing": True},
    {"contiguous_memory_optimization": True, "number_checkpoints": 3},
    {"partition_activations": True, "cpu_checkpointing": True},
]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: ",".join(m) or "recompute")
def test_checkpoint_equals_plain(mode: dict[str, object]) -> None:
    checkpointing.configure(deepspeed_config={"activation_checkpointing": mode})
    torch.manual_seed(0)
    plain = Net(ckpt=False)
    ck = copy.deepcopy(plain)
    ck.ckpt = True
    for step in range(3):
        x = torch.randn(5, 12, generator=torch.Generator().manual_seed(step))
        torch.manual_seed(100 + step)
        a = plain(x)
        a.backward()
        torch.manual_seed(100 + step)
        b = ck(x)
        b.backward()
        assert torch.equal(a, b)  # dropout replayed bit-exactly in the recompute
        for p, q in zip(plain.parameters(), ck.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)
            p.grad = q.grad = None
    checkpointing.configure()


def test_checkpoint_under_stage3_matches() -> None:
    checkpointing.configure(deepspeed_config={"contiguous_memory_optimization": True})
    torch.manual_seed(0)
    plain = Net(ckpt=False).eval()  # no dropout: compares the stage-3 recompute path only
    ck = copy.deepcopy(plain)
    ck.ckpt = True
    ref_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    rt = stage3(
        ck,
        torch.optim.AdamW(ck.parameters(), lr=1e-2),
        stage3_param_persistence_threshold=0,
        stage3_prefetch_bucket_size=100,
    )
    for step in range(4):
        x = torch.randn(5, 12, generator=torch.Generator().manual_seed(step))
        ref_opt.zero_grad()
        a = plain(x)
        a.backward()
        ref_opt.step()
        b = ck(x)
        rt.backward(b)
        rt.step()
        assert torch.equal(a, b)
        assert rt.strategy.partitioner.acct.live_bytes == 0
    checkpointing.configure()


def test_unknown_key_is_named() -> None:
    with pytest.raises(ValueError, match="cpu_checkpoint"):
        checkpointing.configure(deepspeed_config={"cpu_checkpoint": True})
