"""One rank of a multi-process ds.zero test: ``_worker.py SCENARIO RANK WORLD PORT OUT_DIR``.

Each scenario trains the tiny GPT under ds.zero on a real gloo process group; rank 0 also trains
the single-process PyTorch reference on the same global batches and saves both for the test.
"""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _gpt import TinyGPT, batch

from ds.interfaces import registry
from ds.zero.engine import ZeroEngine
from ds.zero.lr_schedules import build_schedule

STEPS = 30
MICRO = 2
LR = 3e-3
WD = 0.01


def base_config(stage: int, **zero: Any) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1000,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}},
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": 2000,
            "allgather_bucket_size": 3000,
            **zero,
        },
    }


def variants() -> dict[str, dict[str, Any]]:
    v: dict[str, dict[str, Any]] = {
        "stage0": base_config(0, overlap_comm=True),
        "stage1": base_config(1, overlap_comm=False),
        "stage2": base_config(2, overlap_comm=True),
        "stage2_allreduce": base_config(2, reduce_scatter=False),
        "stage2_offload": base_config(2, offload_optimizer={"device": "cpu"}),
        "stage1_offload": base_config(1, offload_optimizer={"device": "cpu"}),
    }
    for stage in (0, 1, 2):
        cfg = base_config(stage, overlap_comm=True)
        cfg["gradient_accumulation_steps"] = 4
        v[f"stage{stage}_gas4"] = cfg
    for stage in (1, 2, 3):
        cfg = base_config(stage)
        cfg["gradient_clipping"] = 0.05
        v[f"stage{stage}_clip"] = cfg
    # Stage 3 accumulates reduced micro-batch gradients into its partitions (the rest of stage 3
    # is covered by tests/zero/test_stage3_parity.py).
    cfg = base_config(3, stage3_param_persistence_threshold=64, stage3_prefetch_bucket_size=500)
    cfg["gradient_accumulation_steps"] = 4
    v["stage3_gas4"] = cfg
    schedules = {
        "WarmupLR": {"warmup_min_lr": 0.0, "warmup_max_lr": LR, "warmup_num_steps": 10},
        "WarmupDecayLR": {
            "total_num_steps": STEPS,
            "warmup_max_lr": LR,
            "warmup_num_steps": 5,
            "warmup_type": "linear",
        },
        "WarmupCosineLR": {"total_num_steps": STEPS, "warmup_num_steps": 5},
        "OneCycle": {
            "cycle_min_lr": 1e-4,
            "cycle_max_lr": LR,
            "cycle_first_step_size": 10,
            "decay_lr_rate": 0.1,
            "decay_step_size": 2,
            "cycle_min_mom": 0.85,
            "cycle_max_mom": 0.9,
        },
        "LRRangeTest": {
            "lr_range_test_min_lr": 1e-4,
            "lr_range_test_step_size": 5,
            "lr_range_test_step_rate": 1.0,
        },
    }
    for i, (name, params) in enumerate(schedules.items()):
        cfg = base_config(1 + i % 2)
        cfg["scheduler"] = {"type": name, "params": params}
        v[f"sched_{name}"] = cfg
    cfg = base_config(2)
    del cfg["optimizer"]
    v["stage2_client_optimizer"] = cfg
    return v


def make_comm(rank: int, world: int, port: str) -> Any:
    comm = registry.get(registry.COMM_BACKENDS, "torch")()
    comm.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank, world, 120.0)
    return comm


def kernels() -> Any:
    return registry.get(registry.KERNELS, "cpu")()


def checkpoint_engine(comm: Any) -> Any:
    if registry.has_provider(registry.CHECKPOINT_ENGINES, "default"):
        return registry.get(registry.CHECKPOINT_ENGINES, "default")(comm)
    from ds.checkpoint.engine import ShardedCheckpointEngine

    return ShardedCheckpointEngine(comm)


def fresh_model(seed: int = 0) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT()


def train_engine(
    engine: ZeroEngine, rank: int, world: int, start: int, stop: int, hook: Any = None
) -> list[float]:
    gas = engine.gradient_accumulation_steps()
    mb = engine.train_micro_batch_size_per_gpu()
    losses = []
    for s in range(start, stop):
        x, y = batch(s, world * mb * gas)
        for k in range(gas):
            lo = (k * world + rank) * mb
            loss = engine(x[lo : lo + mb], y[lo : lo + mb])
            if hook is not None:
                loss = hook(s, loss)
            engine.backward(loss)
            engine.step()
        assert engine.last_metrics is not None
        losses.append(float(engine.last_metrics.loss or 0.0))
    return losses


def mean_over_ranks(comm: Any, values: list[float], world: int) -> list[float]:
    gathered: list[Any] = [None] * world
    comm.all_gather_object(gathered, values)
    return [sum(col) / world for col in zip(*gathered)]


def reference(cfg: dict[str, Any], world: int, client: bool = False) -> dict[str, Any]:
    model = fresh_model()
    gas = cfg["gradient_accumulation_steps"]
    rows = world * MICRO * gas
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, foreach=False)
    sched: Any = None
    if "scheduler" in cfg:
        sched = build_schedule(cfg["scheduler"]["type"], opt, dict(cfg["scheduler"]["params"]))
    if client:
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    clip = cfg.get("gradient_clipping", 1.0)  # DeepSpeed's default when the key is absent
    losses, norms = [], []
    for s in range(STEPS):
        x, y = batch(s, rows)
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip else math.inf)
        norms.append(float(norm))
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(float(loss))
    return {"losses": losses, "weights": copy.deepcopy(model.state_dict()), "norms": norms}


def _trained(engine: Any, rank: int, world: int, comm: Any) -> tuple[list[float], dict]:
    """``STEPS`` steps of ``engine``: the losses averaged over the ranks, and the whole weights
    (every rank takes the state dict: under stage 3 it gathers each parameter)."""
    losses = mean_over_ranks(comm, train_engine(engine, rank, world, 0, STEPS), world)
    return losses, copy.deepcopy(engine.module.state_dict())


def scenario_parity(rank: int, world: int, comm: Any, out: Path, only: str = "") -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, cfg in variants().items():
        if only and name not in only.split(","):
            continue
        model = fresh_model()
        extra: dict[str, Any] = {}
        client = name.endswith("client_optimizer")
        if client:
            opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, foreach=False)
            extra = {
                "optimizer": opt,
                "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5),
            }
        engine = ZeroEngine(model, cfg, comm=comm, kernels=kernels(), **extra)
        losses, weights = _trained(engine, rank, world, comm)
        if rank == 0:
            results[name] = {
                "losses": losses,
                "weights": weights,
                "lr": engine.get_lr(),
                "reference": reference(cfg, world, client),
            }
        engine.destroy()
    return results


def scenario_precision(rank: int, world: int, comm: Any, out: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, section, stage in (
        ("bf16_stage2", {"bf16": {"enabled": True}}, 2),
        ("bf16_stage0", {"bf16": {"enabled": True}}, 0),
        ("fp16_stage1", {"fp16": {"enabled": True, "initial_scale_power": 8}}, 1),
        ("fp16_stage2", {"fp16": {"enabled": True, "initial_scale_power": 8}}, 2),
    ):
        cfg = {**base_config(stage), **section}
        engine = ZeroEngine(fresh_model(), cfg, comm=comm)
        losses = mean_over_ranks(comm, train_engine(engine, rank, world, 0, STEPS), world)
        if rank == 0:
            results[name] = {
                "losses": losses,
                "dtype": str(next(engine.module.parameters()).dtype),
                "skipped": engine.skipped_steps,
                "reference": reference(base_config(stage), world),
            }
        engine.destroy()

    # Forced overflow: rank 1's loss becomes inf at step 10 only.
    cfg = {**base_config(2), "fp16": {"enabled": True, "initial_scale_power": 8, "hysteresis": 1}}
    engine = ZeroEngine(fresh_model(), cfg, comm=comm)
    snapshots: dict[int, dict[str, torch.Tensor]] = {}
    scales: list[float] = []

    def poison(step: int, loss: torch.Tensor) -> torch.Tensor:
        snapshots[step] = copy.deepcopy(engine.module.state_dict())
        scales.append(engine.loss_scale)
        if step == 10 and rank == 1:
            return loss * float("inf")
        return loss

    train_engine(engine, rank, world, 0, 14, hook=poison)
    if rank == 0:
        results["overflow"] = {
            "snapshots": snapshots,
            "scales": scales,
            "skipped": engine.skipped_steps,
            "global_steps": engine.global_steps,
        }
    engine.destroy()

    # Memory by construction.
    for stage, offload in ((0, False), (1, False), (2, False), (2, True)):
        zero = {"offload_optimizer": {"device": "cpu"}} if offload else {}
        engine = ZeroEngine(fresh_model(), base_config(stage, **zero), comm=comm, kernels=kernels())
        x, y = batch(0, world * MICRO)
        loss = engine(x[rank * MICRO : (rank + 1) * MICRO], y[rank * MICRO : (rank + 1) * MICRO])
        engine.backward(loss)
        grads_kept = sum(p.grad.numel() for p in engine.module.parameters() if p.grad is not None)
        engine.step()
        report = engine.memory_report()
        state_shapes = [
            tuple(v.shape)
            for st in engine.optimizer.state.values()
            for v in st.values()
            if isinstance(v, torch.Tensor) and v.dim() > 0
        ]
        gathered: list[Any] = [None] * world
        comm.all_gather_object(
            gathered,
            {
                "optimizer_state_bytes": report.optimizer_state_bytes,
                "gradient_bytes": report.gradient_bytes,
                "master_weight_bytes": report.master_weight_bytes,
                "grads_kept_after_backward": grads_kept,
                "state_shapes": state_shapes,
            },
        )
        if rank == 0:
            results[f"memory_stage{stage}{'_offload' if offload else ''}"] = {
                "ranks": gathered,
                "numel": sum(p.numel() for p in engine.module.parameters()),
            }
        engine.destroy()
    return results


def scenario_resume(
    rank: int, world: int, comm: Any, out: Path, stage: str = "2"
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    st = int(stage)
    cfg = base_config(st)
    cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_max_lr": LR, "warmup_num_steps": 10}}
    if st == 1:
        cfg["bf16"] = {"enabled": True}
    ckpt = checkpoint_engine(comm)
    full = ZeroEngine(fresh_model(), cfg, comm=comm, checkpoint_engine=ckpt)
    train_engine(full, rank, world, 0, STEPS)
    full_weights = copy.deepcopy(full.module.state_dict())
    full.destroy()

    first = ZeroEngine(fresh_model(), cfg, comm=comm, checkpoint_engine=ckpt)
    train_engine(first, rank, world, 0, 15)
    at15 = copy.deepcopy(first.module.state_dict())
    first.save_checkpoint(str(out / "ckpt"), client_state={"epoch": 3})
    first.destroy()

    second = ZeroEngine(fresh_model(seed=123), cfg, comm=comm, checkpoint_engine=ckpt)
    path, client_state = second.load_checkpoint(str(out / "ckpt"))
    loaded15 = copy.deepcopy(second.module.state_dict())
    steps_after_load = second.global_steps
    train_engine(second, rank, world, 15, STEPS)
    resumed = copy.deepcopy(second.module.state_dict())

    # The same checkpoint read by another stage (resharding of optimizer partitions).
    other = ZeroEngine(
        fresh_model(seed=7),
        base_config(0 if st else 1) | {"scheduler": cfg["scheduler"]},
        comm=comm,
        checkpoint_engine=ckpt,
    )
    other.load_checkpoint(str(out / "ckpt"))
    other_weights = copy.deepcopy(other.module.state_dict())
    if rank == 0:
        results = {
            "full": full_weights,
            "resumed": resumed,
            "at15": at15,
            "loaded15": loaded15,
            "other_stage_loaded": other_weights,
            "client_state": client_state,
            "steps_after_load": steps_after_load,
            "path": path,
        }
    return results


def scenario_reshard(rank: int, world: int, comm: Any, out: Path, src: str = "") -> dict[str, Any]:
    """Load a checkpoint written by another world size and keep training."""
    ckpt = checkpoint_engine(comm)
    cfg = base_config(2)
    engine = ZeroEngine(fresh_model(seed=5), cfg, comm=comm, checkpoint_engine=ckpt)
    engine.load_checkpoint(src)
    loaded = copy.deepcopy(engine.module.state_dict())
    train_engine(engine, rank, world, 15, 16)
    return {"loaded": loaded, "global_steps": engine.global_steps} if rank == 0 else {}


class Probe(torch.nn.Module):
    """One parameter whose gradient is exactly the constant each rank passes in."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(64))

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return (self.w * c).sum()


def reduction_variants() -> dict[str, dict[str, Any]]:
    """Gradient-reduction settings: prescale, predivide, the communication dtype and summing
    instead of averaging (``gradient_allreduce_op``)."""
    v: dict[str, dict[str, Any]] = {}
    for stage in (0, 1, 2):
        v[f"fp16comm_stage{stage}"] = {"communication_data_type": "fp16"}
        v[f"fp16comm_prescale_stage{stage}"] = {
            "communication_data_type": "fp16",
            "prescale_gradients": True,
        }
        v[f"fp16comm_predivide_stage{stage}"] = {
            "communication_data_type": "fp16",
            "gradient_predivide_factor": 2.0,
        }
        v[f"bf16comm_stage{stage}"] = {"communication_data_type": "bf16"}
        v[f"fp32comm_stage{stage}"] = {"communication_data_type": "fp32"}
        v[f"fp32sum_stage{stage}"] = {
            "communication_data_type": "fp32",
            "gradient_allreduce_op": "sum",
        }
    return v


def scenario_reduction(rank: int, world: int, comm: Any, out: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    # 1. The averaged gradient of a probe whose per-rank gradient is a chosen constant: fp16
    #    communication overflows on 40000 + 40000 unless the gradients are divided first, and
    #    bf16 communication rounds 1 + 2**-10 to 1.
    for name, extra in reduction_variants().items():
        stage = int(name[-1])
        value = 1.0 + 2.0**-10 if name.startswith(("bf16", "fp32")) else 40000.0
        cfg = {**base_config(stage), **extra}
        engine = ZeroEngine(Probe(), cfg, comm=comm)
        engine.backward(engine(torch.full((64,), value)))
        shards = [g.detach().clone() for g in engine.strategy.local_grad_shards()]
        gathered: list[Any] = [None] * world
        comm.all_gather_object(gathered, shards)
        if rank == 0:
            results[name] = {"value": value, "shards": gathered}
        engine.destroy()
    # 2. Training parity with the single-process AdamW reference.
    for name, stage, extra in (
        ("train_prescale_stage1", 1, {"prescale_gradients": True}),
        ("train_predivide_stage2", 2, {"gradient_predivide_factor": 4.0}),
        ("train_bf16comm_stage1", 1, {"communication_data_type": "bf16"}),
        ("train_bf16comm_stage2", 2, {"communication_data_type": "bf16"}),
        (
            "train_fp16comm_prescale_stage0",
            0,
            {"communication_data_type": "fp16"} | {"prescale_gradients": True},
        ),
    ):
        cfg = {**base_config(stage, overlap_comm=True), **extra}
        engine = ZeroEngine(fresh_model(), cfg, comm=comm)
        losses, weights = _trained(engine, rank, world, comm)
        if rank == 0:
            results[name] = {
                "losses": losses,
                "weights": weights,
                "reference": reference(base_config(stage), world),
            }
        engine.destroy()
    return results


def scenario_lazy_gather(rank: int, world: int, comm: Any, out: Path) -> dict[str, Any]:
    """Read the weights right after step(), while the stage 1-2 parameter gather is in flight."""
    results: dict[str, Any] = {}
    for stage, overlap in ((1, True), (2, True), (1, False), (2, False)):
        cfg = base_config(stage, overlap_comm=overlap)
        engine = ZeroEngine(fresh_model(), cfg, comm=comm)
        train_engine(engine, rank, world, 0, STEPS)
        in_flight = bool(engine.strategy._gathers)  # type: ignore[attr-defined]
        if overlap:  # through the engine, which completes the gather first
            named = {n: p.detach().clone() for n, p in engine.named_parameters()}
        else:  # straight from the module: the weights must already be whole
            named = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
        if rank == 0:
            results[f"stage{stage}" + ("" if overlap else "_sync")] = {
                "in_flight": in_flight,
                "named": named,
                "reference": reference(cfg, world),
            }
        engine.destroy()
    return results


SCENARIOS = {
    "lazy_gather": scenario_lazy_gather,
    "reduction": scenario_reduction,
    "parity": scenario_parity,
    "precision": scenario_precision,
    "resume": scenario_resume,
    "reshard": scenario_reshard,
}


def main() -> None:
    scenario, rank, world, port, out = sys.argv[1:6]
    extra = sys.argv[6:]
    torch.set_num_threads(1)
    r, w = int(rank), int(world)
    comm = make_comm(r, w, port)
    result = SCENARIOS[scenario](r, w, comm, Path(out), *extra)
    if r == 0:
        torch.save(result, Path(out) / f"{scenario}.pt")
    comm.barrier()
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
