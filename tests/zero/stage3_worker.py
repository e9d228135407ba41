"""One rank of a stage-3 scenario, started by the tests in this folder (not collected by pytest).

Usage: python stage3_worker.py RANK WORLD PORT CASE_JSON OUT_DIR
Writes OUT_DIR/rank{RANK}.pt with the losses, final consolidated weights and accounting.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        # No qkv bias: the key bias has an identically zero gradient (softmax is shift-invariant),
        # so Adam would turn pure rounding noise into full-size updates and parity into chance.
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attn(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(
        self,
        vocab: int = 64,
        d: int = 32,
        layers: int = 2,
        heads: int = 2,
        seq: int = 16,
        ckpt: Any = None,
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.ckpt = ckpt  # activation checkpoint function, or None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = self.ckpt(b, x) if self.ckpt is not None else b(x)
        return self.head(self.ln(x))


def loss_of(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    logits = model(idx[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


def batches(steps: int, global_batch: int, vocab: int = 64, seq: int = 16) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab, (global_batch, seq + 1), generator=g) for _ in range(steps)]


def model_kwargs(case: dict[str, Any]) -> dict[str, Any]:
    return dict(case.get("model", {}))


def reference(case: dict[str, Any]) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Single-process AdamW on the global batch: what every stage-3 run must reproduce."""
    torch.manual_seed(case.get("seed", 0))
    model = TinyGPT(**model_kwargs(case))
    opt = torch.optim.AdamW(model.parameters(), lr=case.get("lr", 3e-3), weight_decay=0.01)
    losses = []
    for idx in batches(case["steps"], case["global_batch"]):
        opt.zero_grad()
        loss = loss_of(model, idx)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def main() -> None:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    case = json.loads(sys.argv[4])
    out_dir = sys.argv[5]
    torch.set_num_threads(1)
    from ds.interfaces.registry import get
    from ds.zero.init import Init
    from ds.zero.stage3 import AioSettings, OffloadSettings, Stage3Limits, Stage3Runtime

    comm = get("ds.comm_backends", "torch")()
    comm.init_process_group(
        "gloo", f"tcp://127.0.0.1:{port}", rank, world, case.get("pg_timeout", 60)
    )
    torch.manual_seed(case.get("seed", 0))
    kw = model_kwargs(case)
    if case.get("checkpointing"):
        from ds.zero.checkpointing import checkpoint, configure

        configure(comm=comm, **case["checkpointing"])
        kw["ckpt"] = checkpoint
    if case.get("init", False):
        with Init(comm=comm):
            model = TinyGPT(**kw)
    else:
        model = TinyGPT(**kw)
    opt = torch.optim.AdamW(model.parameters(), lr=case.get("lr", 3e-3), weight_decay=0.01)
    kernels = None
    if case.get("kernels"):
        kernels = get("ds.kernels", case["kernels"])()
    nvme = os.path.join(out_dir, "nvme")
    off = case.get("offload", {})
    offload = OffloadSettings(
        param_device=off.get("param", "none"),
        optimizer_device=off.get("optimizer", "none"),
        param_nvme_path=nvme,
        optimizer_nvme_path=nvme,
        max_in_cpu=off.get("max_in_cpu", 1_000_000_000),
        aio=AioSettings(block_size=4096, queue_depth=4, use_o_direct=False),
    )
    rt = Stage3Runtime(
        model,
        opt,
        comm,
        limits=Stage3Limits(**case.get("limits", {})),
        offload=offload,
        kernels=kernels,
    )
    per = case["global_batch"] // world
    losses = []
    dynamic = case.get("dynamic")
    for step, idx in enumerate(batches(case["steps"], case["global_batch"])):
        local = idx[rank * per : (rank + 1) * per]
        if dynamic and step == 1 and rank == 1:
            # Rank 1 takes a different path through the model on this step only.
            x = model.tok(local[:, :-1]) + model.pos(torch.arange(local.shape[1] - 1))
            for b in reversed(model.blocks):
                x = b(x)
            logits = model.head(model.ln(x))
            loss = nn.functional.cross_entropy(logits.reshape(-1, 64), local[:, 1:].reshape(-1))
        else:
            loss = loss_of(model, local)
        rt.backward(loss)
        rt.step()
        avg = loss.detach().clone()
        comm.all_reduce(avg)
        losses.append(float(avg) / world)
    full = rt.consolidated_state_dict()
    acct = rt.accounting
    torch.save(
        {
            "losses": losses,
            "weights": full,
            "acct": vars(acct).copy(),
            "max_live": rt.partitioner.limits.max_live_parameters,
        },
        os.path.join(out_dir, f"rank{rank}.pt"),
    )
    rt.close()
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
    _ = math  # keep import for scenario extensions
