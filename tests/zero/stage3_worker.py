"""One rank of a stage-3 scenario, started by the tests in this folder (not collected by pytest).

Usage: python stage3_worker.py RANK WORLD PORT CASE_JSON OUT_DIR
Writes OUT_DIR/rank{RANK}.pt with the losses, final consolidated weights and accounting.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
from _gpt import TinyGPT as GPTLayout
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


class TinyGPT(GPTLayout):
    """_gpt.py's tiny GPT with this file's blocks, returning the logits."""

    def __init__(self, ckpt: Any = None, **shape: int) -> None:
        super().__init__(**shape, block=Block)
        self.ckpt = ckpt  # activation checkpoint function, or None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
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


def ds_config(case: dict[str, Any], world: int, nvme: str) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": 3, **case.get("zero", {})}
    off = case.get("offload", {})
    if "param" in off:
        zero["offload_param"] = {
            "device": off["param"],
            "nvme_path": nvme,
            **off.get("param_extra", {}),
        }
    if "optimizer" in off:
        zero["offload_optimizer"] = {"device": off["optimizer"], "nvme_path": nvme}
    cfg: dict[str, Any] = {
        "train_batch_size": case["global_batch"],
        "train_micro_batch_size_per_gpu": case["global_batch"] // world,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": case.get("lr", 3e-3), "weight_decay": 0.01},
        },
        "zero_optimization": zero,
        "aio": {"block_size": 4096, "queue_depth": 4},
    }
    if "activation_checkpointing" in case:
        cfg["activation_checkpointing"] = case["activation_checkpointing"]
    return cfg


def partition_activations_case(comm: Any) -> dict[str, Any]:
    """Ranks holding identical activations split the saved inputs and gather them in backward."""
    from ds.zero import activation_checkpointing as checkpointing
    from ds.zero.activation_checkpointing.stash import stash

    settings = checkpointing.configure(
        comm=comm, partition_activations=True, cpu_checkpointing=True
    )
    torch.manual_seed(7)
    layer = nn.Sequential(nn.Linear(10, 30), nn.GELU(), nn.Linear(30, 10))
    x = torch.randn(6, 10, requires_grad=True)
    # backward(), not autograd.grad(): recomputation runs its own backward (reentrant).
    plain = layer(x).pow(2).sum()
    plain.backward()
    gp = [t.grad.clone() for t in (x, *layer.parameters())]  # type: ignore[union-attr]
    for t in (x, *layer.parameters()):
        t.grad = None
    ck = checkpointing.checkpoint(layer, x).pow(2).sum()
    ck.backward()
    gc = [t.grad for t in (x, *layer.parameters())]
    saved = stash(x, settings, 0)
    checkpointing.configure()
    return {
        "loss_equal": bool(torch.equal(plain, ck)),
        "max_grad_diff": max(float((a - b).abs().max()) for a, b in zip(gp, gc)),
        "stash_numel": int(saved.data.numel()),
        "full_numel": int(x.numel()),
    }


def modifier_case(comm: Any, rank: int) -> dict[str, Any]:
    """GatheredParameters(modifier_rank=0): rank 0's edit lands in every rank's shard."""
    from ds.zero.init import GatheredParameters, Init

    with Init(comm=comm):
        lin = nn.Linear(5, 3)
    with GatheredParameters(list(lin.parameters()), modifier_rank=0), torch.no_grad():
        seen_whole = tuple(lin.weight.shape)
        lin.weight.copy_(torch.arange(15.0).view(3, 5) * (1 if rank == 0 else -7))
        lin.bias.fill_(rank + 1.0)
    with GatheredParameters(list(lin.parameters())):
        weight, bias = lin.weight.detach().clone(), lin.bias.detach().clone()
    torch.manual_seed(1000 + rank)  # ranks initialise differently: rank 0's values must win
    with Init(comm=comm):
        other = nn.Linear(4, 4)
    with GatheredParameters(other.weight):
        seeded = other.weight.detach().clone()
    return {
        "seen": seen_whole,
        "weight": weight,
        "bias": bias,
        "after": lin.weight.numel(),
        "seeded": seeded,
    }


def run_case(
    case: dict[str, Any], comm: Any, rank: int, world: int, out_dir: str
) -> dict[str, Any]:
    from ds.interfaces.registry import get
    from ds.zero.engine import ZeroEngine
    from ds.zero.init import Init

    if case.get("kind") == "modifier":
        return modifier_case(comm, rank)
    if case.get("kind") == "partition_activations":
        return partition_activations_case(comm)
    if case.get("kind") == "load":
        return load_case(case, comm, rank, world, out_dir)

    torch.manual_seed(case.get("seed", 0))
    kw = model_kwargs(case)
    if "activation_checkpointing" in case:
        from ds.zero import activation_checkpointing as checkpointing

        # Data-parallel ranks hold different activations: nothing to partition across here.
        checkpointing.configure(deepspeed_config=case["activation_checkpointing"])
        kw["ckpt"] = checkpointing.checkpoint
    if case.get("init", True):
        with Init(comm=comm):
            model = TinyGPT(**kw)
    else:
        model = TinyGPT(**kw)
    nvme = os.path.join(out_dir, f"nvme-{case['name']}")
    kernels = get("ds.kernels", "cpu")()
    ckpt_engine = get("ds.checkpoint_engines", "default")(comm)
    engine = ZeroEngine(
        model,
        ds_config(case, world, nvme),
        comm=comm,
        kernels=kernels,
        checkpoint_engine=ckpt_engine,
    )
    if case.get("bucketed"):
        # The device path (NCCL's bucketed all_gather_into_tensor / reduce_scatter_tensor)
        # on gloo's host tensors, instead of the host-tensor exchanges.
        engine.strategy.coll.all_reduce = False  # type: ignore[attr-defined]
    per = case["global_batch"] // world
    losses = []
    pool_trace: list[tuple[int, int, int, int]] = []
    for step, idx in enumerate(batches(case["steps"], case["global_batch"])):
        if step == case.get("save_at"):
            engine.save_checkpoint(case["save_dir"], "t")
        local = idx[rank * per : (rank + 1) * per]
        if case.get("dynamic") and step == 1 and rank == 1:
            # Rank 1 runs the blocks in a different order (or, with "skip", none of them: its
            # next collective then moves parameters of another size) on this step only.
            blocks = list(engine.module.blocks)
            changed = [] if case["dynamic"] == "skip" else list(reversed(blocks))
            engine.module.blocks = torch.nn.ModuleList(changed)
            loss = loss_of(engine, local)
            engine.module.blocks = torch.nn.ModuleList(blocks)
        else:
            loss = loss_of(engine, local)
        engine.backward(loss)
        engine.step()
        stats = engine.strategy.partitioner.pool.stats  # type: ignore[attr-defined]
        pool_trace.append((stats.fresh, stats.allocated_bytes, stats.free_bytes, stats.deferred))
        avg = loss.detach().clone()
        comm.all_reduce(avg)
        losses.append(float(avg) / world)
    files16 = []
    if case.get("save16"):
        # save_checkpoint writes the consolidated file into the tag directory; the method
        # writes it wherever asked.
        engine.save_checkpoint(case["save_dir"], "final")
        files16.append(os.path.join(case["save_dir"], "final", "pytorch_model.bin"))
        direct = os.path.join(out_dir, f"w16-{case['name']}")
        assert engine.save_16bit_model(direct, "model.bin")
        files16.append(os.path.join(direct, "model.bin"))
    strategy = engine.strategy
    result = {
        "files16": files16,
        "pool": pool_trace,
        "pool_budget": strategy.partitioner.pool.budget_bytes,  # type: ignore[attr-defined]
        "peak_grad_numel": strategy.partitioner.grads.peak_held_numel,  # type: ignore[attr-defined]
        "losses": losses,
        "coll": _coll_counts(strategy),
        "weights": strategy.consolidated_state_dict(),  # type: ignore[attr-defined]
        "acct": vars(strategy.partitioner.acct).copy(),  # type: ignore[attr-defined]
        "limits": vars(strategy.limits).copy() if hasattr(strategy.limits, "__dict__") else {},
    }
    strategy.release()
    return result


def _coll_counts(strategy: Any) -> dict[str, int]:
    coll, grads = strategy.coll, strategy.partitioner.grads
    return {
        "gathered_params": coll.gathered_params,
        "gather_collectives": coll.collectives,
        "checks": coll.checks,
        "grads_reduced": grads.reduced,
        "grad_collectives": grads.collectives,
    }


def load_case(
    case: dict[str, Any], comm: Any, rank: int, world: int, out_dir: str
) -> dict[str, Any]:
    """Load a checkpoint written at another world size/stage and continue training."""
    from ds.interfaces.registry import get
    from ds.zero.engine import ZeroEngine
    from ds.zero.init import Init

    torch.manual_seed(123)  # deliberately different init: every weight must come from the file
    if case["stage"] == 3:
        with Init(comm=comm):
            model = TinyGPT(**model_kwargs(case))
    else:
        model = TinyGPT(**model_kwargs(case))
    cfg = ds_config(case, world, "")
    cfg["zero_optimization"]["stage"] = case["stage"]
    engine = ZeroEngine(
        model,
        cfg,
        comm=comm,
        kernels=get("ds.kernels", "cpu")(),
        checkpoint_engine=get("ds.checkpoint_engines", "default")(comm),
    )
    engine.load_checkpoint(case["save_dir"], "t")
    per = case["global_batch"] // world
    losses = []
    for step, idx in enumerate(batches(case["steps"], case["global_batch"])):
        if step < case["save_at"]:
            continue
        local = idx[rank * per : (rank + 1) * per]
        loss = loss_of(engine, local)
        engine.backward(loss)
        engine.step()
        avg = loss.detach().clone()
        comm.all_reduce(avg)
        losses.append(float(avg) / world)
    engine.strategy.release()
    return {"losses": losses}


def main() -> None:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    cases = json.loads(sys.argv[4])
    out_dir = sys.argv[5]
    torch.set_num_threads(1)
    from ds.interfaces.registry import get

    comm = get("ds.comm_backends", "torch")()
    comm.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank, world, 60)
    results: dict[str, Any] = {}
    for case in cases:
        try:
            results[case["name"]] = run_case(case, comm, rank, world, out_dir)
        except Exception as e:  # reported to the test, which decides whether it was expected
            results[case["name"]] = {"error": f"{type(e).__name__}: {e}"}
            if not case.get("expect_error"):
                raise
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
