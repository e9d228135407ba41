"""One rank of test_zero_to_fp32_script: train a tiny model 2 steps at ZeRO stage STAGE over gloo,
save a checkpoint into OUT/stageSTAGE and, on rank 0, the engine's consolidated fp32 weights into
OUT/engine_stageSTAGE.pt (gathered from the partitions the engine holds).

argv: rank world out stage [stage ...]   (MASTER_ADDR/MASTER_PORT come from the environment)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).with_name("deepspeed_fixtures")))

from deepspeed_fixture_spec import GLOBAL_BATCH, TinyNet, batch, config

import ds.full
import ds.zero
from ds import comm as dist


def main() -> None:
    rank, world, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    ds.full.init_distributed()
    micro = GLOBAL_BATCH // world
    for stage in map(int, sys.argv[4:]):
        torch.manual_seed(1234)
        cfg = config(stage, "fp32", micro)
        cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0  # all sharded
        engine, *_ = ds.full.initialize(model=TinyNet(), config=cfg)
        for step in range(2):
            x, y = batch(step)
            loss = engine(
                x[rank * micro : (rank + 1) * micro], y[rank * micro : (rank + 1) * micro]
            )
            engine.backward(loss)
            engine.step()
        engine.save_checkpoint(str(out / f"stage{stage}"))
        weights = {}
        for name, p in engine.module.named_parameters():
            with ds.zero.GatheredParameters([p]):
                weights[name] = p.detach().clone()
        if rank == 0:
            torch.save(weights, out / f"engine_stage{stage}.pt")
        engine.destroy()
    dist.barrier()


if __name__ == "__main__":
    main()
