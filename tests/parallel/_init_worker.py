"""One rank of ``ds.initialize`` on a tensor/sequence-parallel mesh, 10 steps of a tiny model.

Several scenarios run one after another in the same world (process start-up is most of a small
run's cost). Rank 0 writes each one's losses and reassembled weights to
``out/<scenario>/result.pt``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _parity import run_scenarios_as_rank
from _tp_models import batch, model

STEPS = 10
MICRO = 2
SEQ = 16


def config(tp: int, sp: int, stage: int, micro: int = MICRO) -> dict:
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
        "zero_optimization": {"stage": stage},
        "tensor_parallel": {"autotp_size": tp},
        "sequence_parallel_size": sp,
        "steps_per_print": 1000,
    }


def train(ds, dist, kind: str, tp: int, sp: int, stage: int, out: Path, flag: str) -> dict:
    resume = flag == "resume"
    # "to1" / "to2": save after half the steps at this TP size, finish at TP=1 / TP=2 from the
    # checkpoint; the global batch stays MICRO rows (each rank's micro-batch follows dp).
    reshard = {"to1": 1, "to2": 2}.get(flag)
    world = int(os.environ["WORLD_SIZE"])
    micro = MICRO * tp // world if reshard else MICRO
    # "save" / "load": the first / last half of a run split across two worlds through the
    # checkpoint in $DS_TEST_CKPT; every step's global batch is $DS_TEST_ROWS rows.
    across = flag in ("save", "load")
    if across:
        micro = int(os.environ["DS_TEST_ROWS"]) * tp * sp // world
    net = model(kind, seed=7 if flag == "load" else 0)
    if flag == "deepspeed":
        # DeepSpeed's spelling: tp_model_init before initialize, groups read back.
        import ds.full.compat.deepspeed as deepspeed

        net = deepspeed.tp_model_init(net, tp_size=tp, dtype=torch.float32)
        engine, _, _, _ = deepspeed.initialize(model=net, config=config(tp, sp, stage))
        groups = deepspeed.utils.groups
        sizes = (groups._get_model_parallel_world_size(), groups._get_data_parallel_world_size())
        assert sizes == (tp, engine.mesh.shape.dp), sizes
    else:
        engine, _, _, _ = ds.initialize(model=net, config=config(tp, sp, stage, micro))
        if flag == "load":
            engine.load_checkpoint(os.environ["DS_TEST_CKPT"])
    mesh = engine.mesh
    comm = dist.get_communicator()
    # Without a mesh (tp = sp = 1) every rank is data parallel over the world.
    dp_index = mesh.index("dp") if mesh else comm.get_rank()
    dp = mesh.shape.dp if mesh else comm.get_world_size()
    dp_group = mesh.group("dp") if mesh else None
    losses, norms = [], []
    steps = range(STEPS)
    if across:
        steps = range(STEPS // 2) if flag == "save" else range(STEPS // 2, STEPS)
    for step in steps:
        if resume and step == STEPS // 2:
            engine.save_checkpoint(str(out / "ckpt"))
            engine, _, _, _ = ds.initialize(model=model(kind, seed=7), config=config(tp, sp, stage))
            engine.load_checkpoint(str(out / "ckpt"))
            mesh = engine.mesh
        if reshard and step == STEPS // 2:
            engine.save_checkpoint(str(out / "ckpt"))
            tp, micro = reshard, MICRO * reshard // world
            cfg = config(tp, sp, stage, micro)
            engine, _, _, _ = ds.initialize(model=model(kind, seed=7), config=cfg)
            engine.load_checkpoint(str(out / "ckpt"))
            mesh = engine.mesh
            dp_index = mesh.index("dp") if mesh else comm.get_rank()
            dp = mesh.shape.dp if mesh else comm.get_world_size()
            dp_group = mesh.group("dp") if mesh else None
        ids = batch(step, size=micro * dp, seq=SEQ)[dp_index * micro : (dp_index + 1) * micro]
        if sp > 1:
            from ds.parallel.sequence import sequence_parallel_loss, shard_batch

            part = shard_batch({"input_ids": ids, "labels": ids}, mesh.index("sp"), sp)
            logits = engine(input_ids=part["input_ids"], position_ids=part["position_ids"]).logits
            result = sequence_parallel_loss(logits, part["shift_labels"], comm, mesh.group("sp"))
            loss, reported = result.loss, result.global_loss
        else:
            loss = engine(input_ids=ids, labels=ids).loss
            reported = loss.detach()
        engine.backward(loss)
        engine.step()
        norms.append(engine.get_global_grad_norm())
        # The data-parallel mean of the reported loss is the global batch's loss.
        value = reported.detach().clone()
        comm.all_reduce(value, group=dp_group)
        losses.append(float(value) / dp)
    if flag == "save":
        engine.save_checkpoint(os.environ["DS_TEST_CKPT"])
    from ds.parallel.tp import gather_full_state_dict

    engine.strategy.synchronize_parameters()  # stages 1-2 gather the last step's weights lazily
    report = engine.memory_report()
    memory = {
        "parameter": report.parameter_bytes,
        "optimizer": report.optimizer_state_bytes,
        "master": report.master_weight_bytes,
        "local_numel": sum(p.numel() for p in engine.module.parameters()),
    }
    weights = gather_full_state_dict(engine.module, comm, mesh)
    if flag == "export":
        engine.save_16bit_model(str(out / "export"), "model.safetensors")
        if comm.get_rank() == 0:
            engine.module.config.save_pretrained(str(out / "export"))
    return {"losses": losses, "norms": norms, "weights": weights, "memory": memory}


def run(ds: Any, dist: Any, scenario: str, where: Path) -> dict:
    # A scenario is kind:tp:sp:stage[:flag] ("resume": save after half the steps, rebuild the
    # engine and model, load, finish; "deepspeed": through the DeepSpeed names,
    # deepspeed.tp_model_init then initialize).
    kind, tp, sp, stage, *flag = scenario.split(":")
    return train(ds, dist, kind, int(tp), int(sp), int(stage), where, "".join(flag))


def main() -> None:
    run_scenarios_as_rank(run)


if __name__ == "__main__":
    main()
