"""One rank of the stacked-expert checkpoint test: ``expert_slice_worker.py RANK PORT OUT LAYOUT``.

A world of two; rank r holds rows [2r, 2r + 2) of a stacked expert tensor [4, 3, 5] (each rank
its own replica group, as expert parallelism of 2 on two ranks) beside a dense layer. LAYOUT
"ep": no mesh, stages 0, 1 and 2; "tp": the two ranks also form a tensor-parallel group of 2
(stage 1). For each stage: one Adam step, save, load into a fresh engine, and write what the
test compares (the strategy's shards before the save and after the load, the module's
parameters, the 16-bit export on rank 0)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from ds.interfaces import registry
from ds.interfaces.moe import EXPERT_SLICE_ATTR, REPLICA_ATTR, ExpertSlice, ReplicaGroup
from ds.interfaces.parallel import MeshShape
from ds.zero.engine import ZeroEngine

FULL = (4, 3, 5)


class Experts(torch.nn.Module):
    """A dense layer, then every local expert applied to its output, times a frozen per-expert
    scale (rows of a stacked [4, 3] tensor too)."""

    def __init__(self, first: int, rows: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.dense = torch.nn.Linear(5, 5)
        whole = torch.randn(FULL, generator=torch.Generator().manual_seed(1))
        self.experts = torch.nn.Parameter(whole[first : first + rows].clone())
        scale = torch.rand(FULL[:2], generator=torch.Generator().manual_seed(2))
        self.scale = torch.nn.Parameter(scale[first : first + rows].clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("nd,ekd->nek", self.dense(x), self.experts) * self.scale


def model(first: int, rows: int, replicas: ReplicaGroup) -> Experts:
    m = Experts(first, rows)
    for p, full in ((m.experts, FULL), (m.scale, FULL[:2])):
        setattr(p, REPLICA_ATTR, replicas)
        setattr(p, EXPERT_SLICE_ATTR, ExpertSlice(full, first))
    return m


def config(stage: int, tp: int) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
        "bf16": {"enabled": True},  # fp32 masters apart from the module's weights
        "zero_optimization": {"stage": stage},
    }
    if tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": tp}
    return cfg


class TensorParallelPair:
    """The mesh of two ranks that are one tensor-parallel group (dp = 1): what the engine reads
    of ds.interfaces.parallel.ParallelMesh."""

    def __init__(self, rank: int, world_group: Any, own_group: Any) -> None:
        self.shape, self.rank = MeshShape(dp=1, tp=2), rank
        self._groups = {"tp": world_group, "dp": own_group, "dp_sp": own_group}

    def group(self, dim: str) -> Any:
        return self._groups[dim]

    def ranks(self, dim: str) -> tuple[int, ...]:
        return (0, 1) if dim == "tp" else (self.rank,)

    def index(self, dim: str) -> int:
        return self.rank if dim == "tp" else 0

    def full_state_dict(self, module: Any) -> dict[str, Any]:
        raise NotImplementedError("the test does not export at TP > 1")


def shards(engine: ZeroEngine) -> dict[str, tuple[int, tuple[int, ...], torch.Tensor]]:
    """The strategy's checkpoint tensors: key -> (offset, logical shape, elements)."""
    st = engine.strategy.state_dict()
    return {k: (t.offset, tuple(t.meta.shape), t.local.clone()) for k, t in st.tensors.items()}


def main() -> None:
    rank, port, out, layout = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    comm = registry.get(registry.COMM_BACKENDS, "torch")()
    comm.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank, 2, 120.0)
    ckpt = registry.get(registry.CHECKPOINT_ENGINES, "default")(comm)
    # Every rank creates every group, in order (as ds.parallel.moe.groups does).
    alone = [comm.new_group([r]) for r in range(2)]
    replicas = ReplicaGroup("ep_size_2", alone[rank], (rank,))
    mesh, tp = None, 1
    if layout == "tp":
        mesh, tp = TensorParallelPair(rank, comm.new_group([0, 1]), alone[rank]), 2
    results: dict[Any, Any] = {}
    for stage in (0, 1, 2) if layout == "ep" else (1,):
        kw = {"comm": comm, "checkpoint_engine": ckpt, "mesh": mesh}
        engine = ZeroEngine(model(2 * rank, 2, replicas), config(stage, tp), **kw)
        x = torch.randn(2, 5, generator=torch.Generator().manual_seed(10 + rank)).bfloat16()
        engine.backward(engine(x).float().square().mean())
        engine.step()
        saved = shards(engine)
        params = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
        directory = out / f"{layout}{stage}"
        engine.save_checkpoint(str(directory), "t")
        if layout == "ep":
            engine.save_16bit_model(str(directory), "weights.pt")
        engine.destroy()
        fresh = ZeroEngine(model(2 * rank, 2, replicas), config(stage, tp), **kw)
        with torch.no_grad():
            for p in fresh.module.parameters():
                p.zero_()
        fresh.load_checkpoint(str(directory), "t")
        loaded = {n: p.detach().clone() for n, p in fresh.module.named_parameters()}
        results[stage] = {"saved": saved, "loaded": shards(fresh), "params": params,
                          "loaded_params": loaded}  # fmt: skip
        fresh.destroy()
    torch.save(results, out / f"{layout}_rank{rank}.pt")
    comm.barrier()


if __name__ == "__main__":
    main()
