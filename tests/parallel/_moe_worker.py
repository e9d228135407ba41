"""One rank of ``ds.initialize`` with a MoE layer at ``ep_size`` ranks, 10 steps.

Scenarios ``k:ep:stage[:flag]`` run one after another in the same world; every rank writes its
losses, norms and its share of the weights (dense ones and its experts, by global name) to
``out/<scenario>/rank<r>.pt``. ``resume`` saves after 5 steps, rebuilds the model from other
weights, loads and finishes; ``to1`` / ``to2`` save at this ``ep`` and finish at ``ep_size=1`` / ``2``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _moe_models import CLIP, LR, MICRO, STEPS, Net, batch, model
from _parity import join_world


def config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": CLIP,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}},
        "zero_optimization": {"stage": stage},
        "expert_parallel": {"enabled": True},
        "steps_per_print": 1000,
    }


def build(ds, comm, k: int, ep: int, stage: int, residual: bool, weights: dict | None):
    net = Net(k, ep, residual)
    net.moe.bind(comm)  # this rank's experts by global index
    full = model(k, residual).state_dict() if weights is None else weights
    mine = net.state_dict()
    assert set(mine) <= set(full), sorted(set(mine) - set(full))
    net.load_state_dict({n: full[n] for n in mine})
    engine, _, _, _ = ds.initialize(model=net, config=config(stage))
    return engine


def train(ds, comm, k: int, ep: int, stage: int, flag: str, out: Path) -> dict:
    residual = flag == "residual"
    rank, world = comm.get_rank(), comm.get_world_size()
    engine = build(ds, comm, k, ep, stage, residual, None)
    # DeepSpeed's names report the groups the layer joined.
    from ds.full.compat.deepspeed.utils import groups

    name = f"ep_size_{ep}"
    sizes = (
        groups._get_expert_parallel_world_size(name),
        groups._get_expert_data_parallel_world_size(name),
    )
    assert sizes == (ep, world // ep), sizes
    assert groups._get_expert_parallel_rank(name) == rank % ep
    losses, norms = [], []
    for step in range(STEPS):
        if flag in ("resume", "to1", "to2") and step == STEPS // 2:
            engine.save_checkpoint(str(out / "ckpt"))
            other = {n: torch.zeros_like(v) for n, v in model(k, residual).state_dict().items()}
            new_ep = {"to1": 1, "to2": 2}.get(flag, ep)
            engine = build(ds, comm, k, new_ep, stage, residual, other)
            engine.load_checkpoint(str(out / "ckpt"))
        x, y = batch(step, MICRO * world)
        loss, _ = engine(x[rank * MICRO : (rank + 1) * MICRO], y[rank * MICRO : (rank + 1) * MICRO])
        engine.backward(loss)
        engine.step()
        norms.append(engine.get_global_grad_norm())
        value = loss.detach().clone()
        comm.all_reduce(value)
        losses.append(float(value) / world)
    engine.synchronize_parameters()
    weights = {n: v.detach().clone() for n, v in engine.module.state_dict().items()}
    return {"losses": losses, "norms": norms, "weights": weights}


def main() -> None:
    rank, _, out = join_world()
    import ds.full as ds
    from ds import comm as dist

    ds.init_distributed()
    comm = dist.get_communicator()
    for scenario in sys.argv[5:]:
        k, ep, stage, *flag = scenario.split(":")
        where = out / scenario.replace(":", "-")
        where.mkdir(parents=True, exist_ok=True)
        result = train(ds, comm, int(k), int(ep), int(stage), "".join(flag), where)
        torch.save(result, where / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
