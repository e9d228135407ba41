"""Worker for test_deepspeed_checkpoints: load each DeepSpeed fixture into ds and continue training.

Run under ``ds run --nproc N``: for every case directory given, build the fixture model with other
initial weights, ``engine.load_checkpoint`` the DeepSpeed checkpoint and train the recorded 10 steps
on the same global batches; rank 0 writes losses, learning rates, counters and the final weights.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).with_name("deepspeed_fixtures")
sys.path.insert(0, str(HERE))

from deepspeed_fixture_spec import (  # noqa: E402
    CONTINUE_STEPS,
    GLOBAL_BATCH,
    SAVE_STEPS,
    TinyNet,
    batch,
    config,
)

import ds.full  # noqa: E402
import ds.zero  # noqa: E402
from ds import comm as dist  # noqa: E402


def run_case(spec: str) -> dict:
    """``spec`` is a case directory, or ``DIR@STAGE`` to load it into another ds ZeRO stage."""
    path, _, stage = spec.partition("@")
    case_dir = Path(path)
    expected = json.loads((case_dir / "expected.json").read_text())
    if stage:
        expected["stage"] = int(stage)
    world, rank = dist.get_world_size(), dist.get_rank()
    micro = GLOBAL_BATCH // world
    torch.manual_seed(4321)  # not the fixture's weights: the load must replace them
    model = TinyNet()
    cfg = config(expected["stage"], expected["precision"], micro)
    engine, *_ = ds.full.initialize(model=model, config=cfg)
    path, client = engine.load_checkpoint(str(case_dir))
    assert path is not None
    out: dict = {"global_steps_loaded": engine.global_steps, "client_state": client,
                 "loss_scale_loaded": engine.loss_scaler.cur_scale}  # fmt: skip
    losses, lrs = [], []
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(
        expected["precision"], torch.float32
    )
    for step in range(SAVE_STEPS, SAVE_STEPS + CONTINUE_STEPS):
        x, y = batch(step)
        x, y = x[rank * micro : (rank + 1) * micro], y[rank * micro : (rank + 1) * micro]
        loss = engine(x.to(dtype), y.to(dtype))
        engine.backward(loss)
        engine.step()
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / world)
        lrs.append(engine.get_lr()[0])
    params = {}
    for name, p in engine.module.named_parameters():
        with ds.zero.GatheredParameters([p]):
            params[name] = p.detach().float().reshape(-1).tolist()
    out.update(losses=losses, lrs=lrs, params=params, global_steps=engine.global_steps,
               loss_scale=engine.loss_scaler.cur_scale)  # fmt: skip
    engine.destroy()
    return out


def main() -> None:
    ds.full.init_distributed()
    out_file = Path(sys.argv[1])
    results = {Path(c).name: run_case(c) for c in sys.argv[2:]}
    if dist.get_rank() == 0:
        out_file.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
