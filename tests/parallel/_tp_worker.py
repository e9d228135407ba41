"""One rank of a tensor-parallel parity run: ``_tp_worker.py SCENARIO RANK WORLD PORT OUT [ARGS]``.

Every rank builds the same tiny transformers model (same seed), keeps an untouched copy as the
single-process reference and splits the other with ``ds.parallel.tp.autotp`` over a real gloo
group; rank 0 saves both sides' losses, logits, reassembled gradients and weights for the test.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _tp_models as models

from ds.interfaces import registry
from ds.interfaces.parallel import tp_dim
from ds.parallel.mesh import build_mesh, mesh_shape_from_config
from ds.parallel.tp import autotp, gather_full_state_dict, gather_tensor, tp_group_of

STEPS = 10
LR = 1e-3
# Above the fp32 rounding noise of gradients that are zero in exact arithmetic (a key bias: softmax
# ignores a shift shared by all keys); with eps=1e-8 Adam turns that noise into full-size steps.
EPS = 1e-6


def make_comm(rank: int, world: int, port: str) -> Any:
    comm = registry.get(registry.COMM_BACKENDS, "torch")()
    comm.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank, world, 120.0)
    return comm


def loss_of(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = model(input_ids=ids, labels=ids)
    return out.loss, out.logits


def full_grads(model: torch.nn.Module, comm: Any, tp: Any) -> dict[str, torch.Tensor]:
    grads = {}
    for name, p in model.named_parameters():
        dim = tp_dim(p)
        g = p.grad.detach()
        grads[name] = (
            g.clone() if dim is None else gather_tensor(g, tp, dim, getattr(p, "ds_tp_fused", 1))
        )
    return grads


def replicated_grads_agree(model: torch.nn.Module, comm: Any, tp: Any) -> float:
    """Largest difference between ranks of a replicated parameter's gradient (must be 0)."""
    worst = 0.0
    for _, p in model.named_parameters():
        if tp_dim(p) is None:
            parts = [torch.empty_like(p.grad) for _ in range(tp.size)]
            comm.all_gather(parts, p.grad.detach().contiguous(), group=tp.group)
            worst = max(worst, max(float((x - parts[0]).abs().max()) for x in parts))
    return worst


class Counting:
    """The communicator with its collectives counted (to check how many a step issues)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.counts: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.comm, name)
        if name not in ("all_reduce", "all_gather"):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] = self.counts.get(name, 0) + 1
            return attr(*args, **kwargs)

        return counted


def scenario_parity(rank: int, world: int, comm: Any, out: Path, kinds: str) -> dict[str, Any]:
    res = {kind: parity(comm, kind) for kind in kinds.split(",")}
    if "llama" in res:
        res["llama"]["collectives"] = collectives_per_step(comm)
    return res


def collectives_per_step(comm: Any) -> dict[str, int]:
    counting = Counting(comm)
    m = models.model("llama")
    autotp(m, None, counting)
    ids = models.batch(0)
    loss, _ = loss_of(m, ids)
    forward = dict(counting.counts)
    loss.backward()
    return {f"forward_{k}": v for k, v in forward.items()} | {
        f"step_{k}": v for k, v in counting.counts.items()
    }


def parity(comm: Any, kind: str) -> dict[str, Any]:
    ref = models.model(kind)
    tp_model = copy.deepcopy(ref)
    result = autotp(tp_model, None, comm)
    tp = tp_group_of(None, comm)
    local_numel = sum(p.numel() for p in tp_model.parameters())

    ids = models.batch(0)
    ref_loss, ref_logits = loss_of(ref, ids)
    ref_loss.backward()
    loss, logits = loss_of(tp_model, ids)
    loss.backward()
    res: dict[str, Any] = {
        "plan": {n: p.style for n, p in result.plan.items()},
        "ref_loss": ref_loss.detach(),
        "loss": loss.detach(),
        "ref_logits": ref_logits.detach(),
        "logits": logits.detach(),
        "ref_grads": {n: p.grad.detach().clone() for n, p in ref.named_parameters()},
        "grads": full_grads(tp_model, comm, tp),
        "replicated_grad_spread": replicated_grads_agree(tp_model, comm, tp),
        "full_numel": sum(p.numel() for p in ref.parameters()),
        "local_numel": local_numel,
    }

    # 10 AdamW steps, each rank on its own slices; the reference on the whole model.
    for m in (ref, tp_model):
        m.zero_grad(set_to_none=True)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=LR, weight_decay=0.01, eps=EPS)
    opt_tp = torch.optim.AdamW(tp_model.parameters(), lr=LR, weight_decay=0.01, eps=EPS)
    ref_losses, losses = [], []
    for step in range(STEPS):
        ids = models.batch(step + 1)
        for m, opt, sink in ((ref, opt_ref, ref_losses), (tp_model, opt_tp, losses)):
            opt.zero_grad(set_to_none=True)
            loss, _ = loss_of(m, ids)
            loss.backward()
            opt.step()
            sink.append(float(loss))
    res["ref_losses"] = ref_losses
    res["losses"] = losses
    res["ref_state"] = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    res["state"] = gather_full_state_dict(tp_model, comm, None)
    # The reassembled state loads into a plain transformers model of another seed and gives the
    # trained reference's logits (the checkpoint-export path).
    fresh = models.model(kind, seed=99)
    fresh.load_state_dict(res["state"])
    ids = models.batch(99)
    with torch.no_grad():
        res["export_logits"] = fresh(input_ids=ids).logits
        res["ref_export_logits"] = ref(input_ids=ids).logits
    return res


def scenario_mesh(rank: int, world: int, comm: Any, out: Path, tp: str, sp: str) -> dict[str, Any]:
    mesh = build_mesh(comm, mesh_shape_from_config(world, int(tp), int(sp)))
    sums = {}
    for dim in ("dp", "sp", "tp", "dp_sp"):
        t = torch.tensor([float(rank)])
        comm.all_reduce(t, group=mesh.group(dim))
        sums[dim] = float(t)
    everything = [None] * world
    comm.all_gather_object(everything, {"describe": mesh.describe(), "sums": sums})
    res: dict[str, Any] = {"ranks": everything}
    if mesh.shape.tp == 2 and mesh.shape.dp == 2:
        res["tp_dp"] = tp_times_dp(comm, mesh, "llama")
    return res


def tp_times_dp(comm: Any, mesh: Any, kind: str) -> dict[str, Any]:
    """TP=2 x DP=2: each DP replica splits over its own TP group; DP grads averaged by hand."""
    ref = models.model(kind)
    tp_model = copy.deepcopy(ref)
    autotp(tp_model, mesh, comm)
    dp = mesh.index("dp")
    ids = models.batch(0, size=4)
    ref_loss, _ = loss_of(ref, ids)
    ref_loss.backward()
    loss, _ = loss_of(tp_model, ids[2 * dp : 2 * dp + 2])
    loss.backward()
    for p in tp_model.parameters():
        comm.all_reduce(p.grad, group=mesh.group("dp"))
        p.grad /= mesh.shape.dp
    tp = tp_group_of(mesh, comm)
    return {
        "ref_grads": {n: p.grad.detach().clone() for n, p in ref.named_parameters()},
        "grads": full_grads(tp_model, comm, tp),
        "describe": mesh.describe(),
    }


SCENARIOS = {"parity": scenario_parity, "mesh": scenario_mesh}


def main() -> None:
    scenario, rank, world, port, out, *args = sys.argv[1:]
    rank_i, world_i = int(rank), int(world)
    torch.set_num_threads(1)
    comm = make_comm(rank_i, world_i, port)
    try:
        res = SCENARIOS[scenario](rank_i, world_i, comm, Path(out), *args)
        if rank_i == 0:
            torch.save(res, Path(out) / "result.pt")
        comm.barrier()
    finally:
        comm.destroy_process_group()


if __name__ == "__main__":
    main()
