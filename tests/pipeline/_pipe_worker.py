"""One rank of a gloo world training the tiny GPT as a PipelineModule through ds.initialize.

argv: rank world port out scenario...; a scenario is schedule:zero_stage[:flag...]. Several run
one after another in one world (start-up is most of a small run's cost); rank 0 writes each one's
losses, norms and whole-model weights to out/<scenario>/result.pt. The flag ``tp`` splits each
stage over two tensor-parallel ranks (AutoTP, the block with AutoTP's projection names).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))  # joining the world

from _parity import run_scenarios_as_rank
from _pipe_gpt import TPBlock, batch, pipeline_module

STEPS, MICRO, GAS, STAGES = 10, 2, 4, 2


def config(schedule: str, stage: int, stages: int = STAGES, tp: int = 1) -> dict:
    extra = {"tensor_parallel": {"autotp_size": tp}} if tp > 1 else {}
    return {
        **extra,
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GAS,
        "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
        "zero_optimization": {"stage": stage},
        "pipeline": {"stages": stages, "schedule": schedule},
        "steps_per_print": 1000,
    }


def micro_batches(step: int, dp: int, dp_index: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    # The step's global batch; this data-parallel rank takes its GAS micro-batches in order.
    ids = batch(step, MICRO * GAS * dp)
    out = []
    for j in range(GAS):
        lo = (dp_index * GAS + j) * MICRO
        rows = ids[lo : lo + MICRO]
        out.append((rows, rows))
    return out


def train(ds, schedule: str, stage: int, out: Path, flags: set[str]) -> dict:
    chunks = 2 if schedule == "interleaved_1f1b" else 1
    # One process is one stage; "load" starts from other weights and reads the checkpoint.
    stages = min(STAGES, int(os.environ["WORLD_SIZE"]))
    tp = 2 if "tp" in flags else 1
    block = {"block": TPBlock} if "tp" in flags or "tpblock" in flags else {}
    net = pipeline_module(stages, chunks, seed=99 if "load" in flags else 11, **block)
    cfg = config(schedule, stage, stages, tp)
    if "deepspeed" in flags:  # DeepSpeed's spelling through the compatibility shim
        import ds.full.compat.deepspeed as deepspeed

        assert isinstance(net, deepspeed.pipe.PipelineModule)
        engine, _, _, _ = deepspeed.initialize(model=net, config=cfg)
    else:
        engine, _, _, _ = ds.initialize(model=net, config=cfg)
    if flags & {"load", "resume"}:
        engine.load_checkpoint(os.environ["DS_TEST_CKPT"])
    mesh = engine.mesh
    dp, dp_index = (mesh.shape.dp, mesh.index("dp")) if mesh is not None else (1, 0)
    losses, norms, bubbles = [], [], []
    # "half" trains the first half and saves; "resume" loads that and trains the second half.
    steps = {"load": range(0), "half": range(STEPS // 2), "resume": range(STEPS // 2, STEPS)}
    chosen = [steps[f] for f in flags if f in steps]
    for step in chosen[0] if chosen else range(STEPS):
        loss = engine.train_batch(iter(micro_batches(step, dp, dp_index)))
        losses.append(float(loss))
        norms.append(engine.get_global_grad_norm())
        m = engine.last_metrics
        bubbles.append((m.pipeline_bubble_fraction, m.pipeline_bubble_formula, m.stage_compute_s))
    evaluation = float(engine.eval_batch(iter(micro_batches(STEPS, dp, dp_index))))
    if flags & {"ckpt", "half"}:
        engine.save_checkpoint(str(out / "ckpt"))
    weights = __import__("ds.parallel.pipeline.checkpoint", fromlist=["x"]).full_state_dict(engine)
    if "export" in flags:
        engine.save_16bit_model(str(out / "export"))
    return {
        "losses": losses,
        "norms": norms,
        "bubbles": bubbles,
        "eval": evaluation,
        "weights": weights,
        "loss_on_every_rank": losses,
    }


def run(ds: Any, dist: Any, scenario: str, where: Path) -> dict:
    schedule, stage, *flags = scenario.split(":")
    result = train(ds, schedule, int(stage), where, set(flags))
    # Every rank reports its losses: train_batch returns the batch's loss on all of them.
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, result["losses"])
    result["loss_on_every_rank"] = everyone
    return result


def main() -> None:
    run_scenarios_as_rank(run)


if __name__ == "__main__":
    main()
