"""One rank of the Ulysses parity test: ``_sp_worker.py MODEL RANK WORLD PORT OUT_DIR``.

Every rank builds the same tiny transformers model twice from a local config (same seed): a
single-process reference with ``sdpa`` attention that sees whole batches, and a copy switched to
``ulysses_sdpa`` that sees this rank's sequence shard from :func:`shard_batch`. Gradients of the
sequence-parallel copy are averaged over the SP group, as ZeRO averages them over ``dp_sp``.
Rank 0 writes the relative errors (forward+backward cases and 10 AdamW steps) as JSON.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch

from ds.interfaces import registry
from ds.interfaces.comm import ReduceOp
from ds.parallel.sequence import sequence_parallel_loss, shard_batch, use_ulysses_attention

VOCAB = 96
LR = 3e-3


def make_config(model: str, kv_heads: int) -> Any:
    import transformers

    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[model]
    return cls(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )


def build(model: str, kv_heads: int) -> Any:
    import transformers

    cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}[model]
    torch.manual_seed(0)
    m = cls(make_config(model, kv_heads)).float()
    # Random non-zero biases (Qwen2's q/k/v) so their gradients are exercised too.
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.02)
    return m


def make_batch(seed: int, seq: int, padded: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (2, seq), generator=g)
    labels = ids.clone()
    batch = {"input_ids": ids, "labels": labels}
    if padded:
        # Row 1 has 4 real tokens: after padding 11 -> 12 tokens, rank 0's shard (0-5) holds
        # 6 + 4 real tokens and rank 1's (6-11) only row 0's 5 — an uneven split.
        mask = torch.ones_like(ids)
        mask[1, 4:] = 0
        ids[1, 4:] = 0
        labels[1, 4:] = -100
        batch["attention_mask"] = mask
    return batch


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def average_grads(model: Any, comm: Any, group: Any, sp: int) -> None:
    for p in model.parameters():
        if p.grad is not None:
            comm.all_reduce(p.grad, op=ReduceOp.SUM, group=group)
            p.grad.div_(sp)


def sp_step(model: Any, batch: dict[str, torch.Tensor], comm: Any, group: Any) -> torch.Tensor:
    rank, sp = comm.get_rank(group), comm.get_world_size(group)
    shard = shard_batch(batch, rank, sp)
    out = model(input_ids=shard["input_ids"], position_ids=shard["position_ids"])
    res = sequence_parallel_loss(out.logits, shard["shift_labels"], comm, group)
    res.loss.backward()
    average_grads(model, comm, group, sp)
    assert res.global_loss is not None
    return res.global_loss


def ref_step(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    loss = model(**batch).loss
    loss.backward()
    return loss.detach()


def grad_error(sp_model: Any, ref: Any) -> tuple[float, float]:
    worst, smallest = 0.0, float("inf")
    for p, q in zip(sp_model.parameters(), ref.parameters()):
        worst = max(worst, rel(p.grad, q.grad))
        smallest = min(smallest, float(q.grad.norm()))
    return worst, smallest


def fwd_bwd_case(
    model: str, kv: int, seq: int, padded: bool, comm: Any, group: Any, core: str = "sdpa"
) -> dict:
    ref = build(model, kv)
    sp_model = copy.deepcopy(ref)
    name = use_ulysses_attention(sp_model, comm, group, core=core)
    batch = make_batch(1, seq, padded)
    ref_loss = ref_step(ref, batch)
    sp_loss = sp_step(sp_model, batch, comm, group)
    worst, smallest = grad_error(sp_model, ref)
    return {
        "impl": name,
        "ref_loss": float(ref_loss),
        "loss_rel": abs(float(sp_loss) - float(ref_loss)) / abs(float(ref_loss)),
        "grad_rel": worst,
        "smallest_ref_grad_norm": smallest,
    }


def train_case(model: str, comm: Any, group: Any, steps: int = 10) -> dict:
    ref = build(model, 2)
    sp_model = copy.deepcopy(ref)
    use_ulysses_attention(sp_model, comm, group, core="sdpa")
    opts = [torch.optim.AdamW(m.parameters(), lr=LR, weight_decay=0.01) for m in (ref, sp_model)]
    ref_losses, sp_losses = [], []
    # Two batches in turn (one padded and unevenly split, one odd-length) so the loss falls.
    batches = [make_batch(100, 11, padded=True), make_batch(101, 13, padded=False)]
    for step in range(steps):
        batch = batches[step % 2]
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        ref_losses.append(float(ref_step(ref, batch)))
        sp_losses.append(float(sp_step(sp_model, batch, comm, group)))
        for opt in opts:
            opt.step()
    weight_rel, worst_name = max(
        (rel(p.detach(), q.detach()), name)
        for (name, p), q in zip(sp_model.named_parameters(), ref.parameters())
    )
    flat_sp = torch.cat([p.detach().reshape(-1) for p in sp_model.parameters()])
    flat_ref = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    moved = max(
        rel(q.detach(), p0.detach())
        for q, p0 in zip(ref.parameters(), build(model, 2).parameters())
    )
    return {
        "ref_losses": ref_losses,
        "sp_losses": sp_losses,
        "loss_rel": max(abs(a - b) / abs(b) for a, b in zip(sp_losses, ref_losses)),
        "weight_rel": rel(flat_sp, flat_ref),
        "worst_tensor_rel": weight_rel,
        "worst_weight": worst_name,
        "weights_moved_rel": moved,
    }


def saved_activation_bytes(model: Any, fn: Any) -> int:
    """Bytes autograd keeps for backward during ``fn()``, parameters excluded (each distinct
    storage once): the activation memory a training step holds at its peak."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def activation_case(comm: Any, group: Any, seq: int = 512) -> dict:
    """Saved activations of one forward on the full sequence (one process) and on this rank's
    shard under Ulysses, same model and batch."""
    ref = build("llama", 2)
    sp_model = copy.deepcopy(ref)
    use_ulysses_attention(sp_model, comm, group, core="sdpa")
    batch = make_batch(7, seq, padded=False)
    shard = shard_batch(batch, comm.get_rank(group), comm.get_world_size(group))
    full = saved_activation_bytes(ref, lambda: ref(**batch).loss)

    def sp_forward() -> Any:
        out = sp_model(input_ids=shard["input_ids"], position_ids=shard["position_ids"])
        return sequence_parallel_loss(out.logits, shard["shift_labels"], comm, group).loss

    return {
        "seq": seq,
        "full_bytes": full,
        "sp_bytes": saved_activation_bytes(sp_model, sp_forward),
    }


def main() -> None:
    model, rank, world, port, out_dir = sys.argv[1:6]
    torch.set_num_threads(1)
    comm = registry.get(registry.COMM_BACKENDS, "torch")()
    comm.init_process_group("gloo", f"tcp://127.0.0.1:{port}", int(rank), int(world), 60.0)
    try:
        group = comm.new_group(list(range(int(world))))
        result = {
            "nomask": fwd_bwd_case(model, 2, 12, False, comm, group),
            "padded": fwd_bwd_case(model, 2, 11, True, comm, group),
            "train": train_case(model, comm, group),
        }
        if model == "llama":
            # One kv head for two SP ranks: each rank gets a replica of it.
            result["kv1"] = fwd_bwd_case(model, 1, 12, True, comm, group)
            result["activations"] = activation_case(comm, group)
            # Eager attention masks nothing without a mask: the wrapper supplies the causal one.
            result["eager"] = fwd_bwd_case(model, 2, 12, True, comm, group, core="eager")
        if int(rank) == 0:
            Path(out_dir, f"{model}.json").write_text(json.dumps(result, indent=1))
    finally:
        comm.destroy_process_group()


if __name__ == "__main__":
    main()
