"""One rank of Ulysses under ds.zero: ``_sp_zero_worker.py RANK WORLD PORT OUT_DIR``.

World 2 is one SP=2 group and no data parallelism, so the engine's reduction group (no mesh: the
whole world) is the ``dp_sp`` group of the mesh contract. Each ZeRO stage trains the tiny Llama
with ``ulysses_sdpa`` for 10 steps, backpropagating :func:`sequence_parallel_loss`; rank 0 also
trains the single-process reference (transformers' own loss, torch AdamW) and writes the errors.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _sp_worker import LR, build, make_batch, ref_step, rel

from ds.interfaces import registry
from ds.parallel.sequence import sequence_parallel_loss, shard_batch, use_ulysses_attention

STEPS = 10
WD = 0.01


def config(stage: int) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1000,
        # Far above the real norm: never clips, but makes every stage report the global gradient
        # norm, which (unlike Adam's scale-free steps) shows a wrongly scaled gradient.
        "gradient_clipping": 1e3,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 4000},
    }


def batches() -> list[dict[str, torch.Tensor]]:
    return [make_batch(100, 11, padded=True), make_batch(101, 13, padded=False)]


def reference() -> dict[str, Any]:
    model = build("llama", 2)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, foreach=False)
    losses, norms = [], []
    for step in range(STEPS):
        opt.zero_grad()
        losses.append(float(ref_step(model, batches()[step % 2])))
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e3)))
        opt.step()
    return {"losses": losses, "norms": norms, "weights": copy.deepcopy(model.state_dict())}


def train(stage: int, comm: Any, group: Any) -> dict[str, Any]:
    from ds.zero.engine import ZeroEngine

    model = build("llama", 2)
    use_ulysses_attention(model, comm, group, core="sdpa")
    kernels = registry.get(registry.KERNELS, "cpu")()
    engine = ZeroEngine(model, config(stage), comm=comm, kernels=kernels)
    rank, sp = comm.get_rank(group), comm.get_world_size(group)
    losses, norms = [], []
    for step in range(STEPS):
        shard = shard_batch(batches()[step % 2], rank, sp)
        out = engine(input_ids=shard["input_ids"], position_ids=shard["position_ids"])
        res = sequence_parallel_loss(out.logits, shard["shift_labels"], comm, group)
        engine.backward(res.loss)
        engine.step()
        losses.append(float(res.global_loss))
        norms.append(engine.get_global_grad_norm())
    weights = copy.deepcopy(engine.module.state_dict())
    engine.destroy()
    return {"losses": losses, "norms": norms, "weights": weights}


def main() -> None:
    rank, world, port, out_dir = sys.argv[1:5]
    torch.set_num_threads(1)
    comm = registry.get(registry.COMM_BACKENDS, "torch")()
    comm.init_process_group("gloo", f"tcp://127.0.0.1:{port}", int(rank), int(world), 60.0)
    try:
        group = comm.new_group(list(range(int(world))))
        runs = {stage: train(stage, comm, group) for stage in (0, 1, 2, 3)}
        if int(rank) == 0:
            ref = reference()
            result = {"ref_losses": ref["losses"]}
            for stage, run in runs.items():
                result[f"stage{stage}"] = {
                    "losses": run["losses"],
                    "loss_rel": max(
                        abs(a - b) / abs(b) for a, b in zip(run["losses"], ref["losses"])
                    ),
                    "norms": run["norms"],
                    "norm_rel": max(
                        abs(a - b) / abs(b) for a, b in zip(run["norms"], ref["norms"])
                    ),
                    "weight_rel": rel(
                        torch.cat([run["weights"][n].reshape(-1) for n in ref["weights"]]),
                        torch.cat([w.reshape(-1) for w in ref["weights"].values()]),
                    ),
                    "worst_tensor_rel": max(
                        rel(run["weights"][n], w) for n, w in ref["weights"].items()
                    ),
                }
            Path(out_dir, "zero.json").write_text(json.dumps(result, indent=1))
    finally:
        comm.destroy_process_group()


if __name__ == "__main__":
    main()
