"""One rank of ``ds.initialize`` with ``expert_parallel.autoep_size`` on a tiny Mixtral.

Writes ``out/rank<r>.pt``: its micro-batch's logits and the reduced gradients of the first step,
the losses of ``STEPS`` steps and its final weights (dense ones and its experts by global index).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from _parity import join_world

# A script rank: the suite's support folder is not on its path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from tiny_models import llama_shape

STEPS = 5
MICRO = 2
SEQ = 8


def tiny_mixtral(seed: int = 0):
    import transformers

    shape = llama_shape(16, 24, heads=2, kv_heads=1, vocab=64, positions=64)
    cfg = transformers.MixtralConfig(
        **shape, num_local_experts=4, num_experts_per_tok=2, attn_implementation="eager"
    )
    torch.manual_seed(seed)
    return transformers.MixtralForCausalLM(cfg).float()


def batch(step: int, rows: int) -> torch.Tensor:
    return torch.randint(0, 64, (rows, SEQ), generator=torch.Generator().manual_seed(50 + step))


def config(ep: int, stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,  # compared with transformers stepped by a plain AdamW
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
        "zero_optimization": {"stage": stage},
        "expert_parallel": {"enabled": True, "autoep_size": ep},
        "steps_per_print": 1000,
    }


def main() -> None:
    rank, world, out = join_world(TRANSFORMERS_VERBOSITY="error")
    ep, stage = int(sys.argv[5]), int(sys.argv[6])
    import ds.full as ds
    from ds import comm as dist

    engine, _, _, _ = ds.initialize(model=tiny_mixtral(), config=config(ep, stage))
    comm = dist.get_communicator()
    losses, logits, grads = [], None, {}
    for step in range(STEPS):
        ids = batch(step, MICRO * world)[rank * MICRO : (rank + 1) * MICRO]
        result = engine(input_ids=ids, labels=ids)
        engine.backward(result.loss)
        if step == 0:
            logits = result.logits.detach().clone()
            grads = {
                n: p.grad.detach().clone()
                for n, p in engine.module.named_parameters()
                if p.grad is not None
            }
        engine.step()
        value = result.loss.detach().clone()
        comm.all_reduce(value)
        losses.append(float(value) / world)
    # One model file: every rank's experts collected, restacked into transformers' tensors.
    engine.save_16bit_model(str(out / "export"), "model.safetensors")
    if rank == 0:
        engine.module.config.save_pretrained(str(out / "export"))
    engine.synchronize_parameters()
    weights = {n: v.detach().clone() for n, v in engine.module.state_dict().items()}
    torch.save(
        {"logits": logits, "grads": grads, "losses": losses, "weights": weights},
        out / f"rank{rank}.pt",
    )
    # Resharding: the same run saved after half the steps at this autoep_size and finished at
    # autoep_size=1 from the checkpoint (a differently initialised model loads it).
    engine, _, _, _ = ds.initialize(model=tiny_mixtral(), config=config(ep, stage))
    losses = []
    for step in range(STEPS):
        if step == STEPS // 2:
            engine.save_checkpoint(str(out / "ckpt"))
            engine, _, _, _ = ds.initialize(model=tiny_mixtral(seed=7), config=config(1, stage))
            engine.load_checkpoint(str(out / "ckpt"))
        ids = batch(step, MICRO * world)[rank * MICRO : (rank + 1) * MICRO]
        result = engine(input_ids=ids, labels=ids)
        engine.backward(result.loss)
        engine.step()
        value = result.loss.detach().clone()
        comm.all_reduce(value)
        losses.append(float(value) / world)
    engine.synchronize_parameters()
    weights = {n: v.detach().clone() for n, v in engine.module.state_dict().items()}
    torch.save({"losses": losses, "weights": weights}, out / f"reshard{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
