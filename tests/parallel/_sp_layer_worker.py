"""One rank of the Ulysses layer test: ``_sp_layer_worker.py RANK WORLD PORT OUT_DIR``.

Without transformers: DeepSpeed-layout :class:`DistributedAttention` and :class:`UlyssesAttention`
(with a plain sdpa core) against the full-sequence computation on one process, the loss when one
rank holds no real token, and the mask-shape refusal. Rank 0 writes JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ds.interfaces import registry
from ds.interfaces.comm import ReduceOp
from ds.interfaces.errors import ConfigError
from ds.parallel.sequence import (
    DistributedAttention,
    UlyssesAttention,
    UlyssesDataLoaderAdapter,
    sequence_parallel_loss,
)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def full_inputs(shape: tuple[int, ...]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(shape, generator=g, requires_grad=True) for _ in range(3)]


def sum_grads(t: torch.Tensor, comm: Any, group: Any) -> torch.Tensor:
    g = t.grad.clone()
    comm.all_reduce(g, op=ReduceOp.SUM, group=group)
    return g


def ds_layout(comm: Any, group: Any, rank: int, sp: int) -> dict:
    # [seq, batch, heads, dim]; the local attention sees [seq_full, batch, heads/sp, dim].
    def local(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = F.scaled_dot_product_attention(
            q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3), is_causal=True
        )
        return out.permute(2, 0, 1, 3)

    seq, bsz, heads, dim = 8, 2, 4, 8
    q, k, v = full_inputs((seq, bsz, heads, dim))
    ref = local(q, k, v)
    weight = torch.randn(ref.shape, generator=torch.Generator().manual_seed(3))
    (ref * weight).sum().backward()
    ref_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    n = seq // sp
    part = slice(rank * n, (rank + 1) * n)
    lq, lk, lv = (t.detach()[part].clone().requires_grad_(True) for t in (q, k, v))
    out = DistributedAttention(local, comm, group)(lq, lk, lv)
    (out * weight[part]).sum().backward()
    # each rank's input gradient is its shard of the full one
    return {
        "out_rel": rel(out.detach(), ref.detach()[part]),
        "grad_rel": max(rel(t.grad, g[part]) for t, g in zip((lq, lk, lv), ref_grads)),
    }


def hf_layout(comm: Any, group: Any, rank: int, sp: int, kv_heads: int) -> dict:
    # transformers' layout: q/k/v [batch, heads, seq, dim], output [batch, seq, heads, dim].
    class Module:
        is_causal = True
        num_key_value_groups = 4 // kv_heads

    def core(module: Any, q: Any, k: Any, v: Any, mask: Any, **kw: Any) -> tuple[Any, None]:
        rep = q.shape[1] // k.shape[1]
        assert rep == module.num_key_value_groups
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return out.transpose(1, 2), None

    bsz, seq, dim = 2, 8, 8
    g = torch.Generator().manual_seed(11)
    q = torch.randn(bsz, 4, seq, dim, generator=g, requires_grad=True)
    k = torch.randn(bsz, kv_heads, seq, dim, generator=g, requires_grad=True)
    v = torch.randn(bsz, kv_heads, seq, dim, generator=g, requires_grad=True)
    ref, _ = core(Module(), q, k, v, None)
    weight = torch.randn(ref.shape, generator=g)
    (ref * weight).sum().backward()
    n = seq // sp
    part = slice(rank * n, (rank + 1) * n)
    lq, lk, lv = (t.detach()[:, :, part].clone().requires_grad_(True) for t in (q, k, v))
    attn = UlyssesAttention(core, comm, group)
    out, _ = attn(Module(), lq, lk, lv, None)
    (out * weight[:, part]).sum().backward()
    result = {
        "out_rel": rel(out.detach(), ref.detach()[:, part]),
        "grad_rel": max(
            rel(t.grad, full.grad[:, :, part]) for t, full in zip((lq, lk, lv), (q, k, v))
        ),
    }
    try:
        attn(Module(), lq, lk, lv, torch.ones(bsz, 1, n, n, dtype=torch.bool))
    except ConfigError as e:
        result["mask_error"] = str(e)
    return result


def loss_case(comm: Any, group: Any, rank: int, sp: int) -> dict:
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 8, 11, generator=g)
    labels = torch.randint(0, 11, (2, 8), generator=g)
    labels[:, 4:] = -100  # rank 1's half has no real token
    labels[1, 1] = -100
    ref = F.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1), ignore_index=-100)
    n = 8 // sp
    part = slice(rank * n, (rank + 1) * n)
    res = sequence_parallel_loss(logits[:, part], labels[:, part], comm, group)
    summed = res.loss.detach().clone()
    comm.all_reduce(summed, op=ReduceOp.SUM, group=group)
    assert res.global_loss is not None
    return {
        "global_rel": abs(float(res.global_loss) - float(ref)) / float(ref),
        "sum_over_sp_rel": abs(float(summed) / sp - float(ref)) / float(ref),
        "num_tokens": int(res.num_tokens),
        "local_loss": float(res.loss),
    }


def gathered_loader(comm: Any, group: Any, rank: int, sp: int) -> dict:
    """DeepSpeed's adapter mode: each rank's loader has its own batches (rank 1's one token
    longer); every rank yields its shard of the group's batches in group-rank order."""

    def own_batches(r: int) -> list[dict[str, torch.Tensor]]:
        seq = 6 + r
        return [
            {"input_ids": torch.arange(seq).expand(2, seq) + 1000 * r + 100 * i} for i in range(2)
        ]

    adapter = UlyssesDataLoaderAdapter(own_batches(rank), rank, sp, comm=comm, sp_group=group)
    shards = list(adapter)
    expected = [b for i in range(2) for b in (own_batches(r)[i] for r in range(sp))]
    ok = len(shards) == len(adapter) == 2 * sp
    for shard, want in zip(shards, expected):
        parts: list[Any] = [None] * sp
        comm.all_gather_object(parts, shard["input_ids"], group=group)
        full = torch.cat(parts, dim=1)[:, : want["input_ids"].shape[1]]
        ok = ok and torch.equal(full, want["input_ids"])
    return {"ok": bool(ok), "yielded": len(shards)}


def main() -> None:
    rank, world, port, out_dir = sys.argv[1:5]
    rank_i, sp = int(rank), int(world)
    torch.set_num_threads(1)
    comm = registry.get(registry.COMM_BACKENDS, "torch")()
    comm.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank_i, sp, 60.0)
    try:
        group = comm.new_group(list(range(sp)))
        result = {
            "ds_layout": ds_layout(comm, group, rank_i, sp),
            "hf_kv2": hf_layout(comm, group, rank_i, sp, kv_heads=2),
            "hf_kv1": hf_layout(comm, group, rank_i, sp, kv_heads=1),
            "loss": loss_case(comm, group, rank_i, sp),
            "gathered_loader": gathered_loader(comm, group, rank_i, sp),
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result, indent=1))
    finally:
        comm.destroy_process_group()


if __name__ == "__main__":
    main()
