"""One rank of tools/bench/train.py: build the model, initialise one implementation, time steps.

    train_worker.py IMPL STAGE OFFLOAD STEPS OUT_JSON     (RANK/WORLD_SIZE/MASTER_* in the env)

IMPL is ``ddp`` (torch DistributedDataParallel + torch.optim.AdamW), ``ds`` (ds.full.initialize)
or ``deepspeed`` (deepspeed.initialize). Rank 0 writes step times, initialize time and every
rank's peak RSS to OUT_JSON.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from train_gpt import GPT

VOCAB, D, LAYERS, HEADS, SEQ, MICRO = 8192, 512, 6, 8, 128, 4
WARMUP = 2


def config(stage: int, offload: bool) -> dict:
    zero: dict = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 2e7,
        "allgather_bucket_size": 5e7,
    }
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**6,
        # No clipping, as the DDP rows do none (DeepSpeed's and ds's default clips at 1.0).
        "gradient_clipping": 0.0,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 1e-4, "weight_decay": 0.01, "torch_adam": not offload},
        },
        "zero_optimization": zero,
    }


def _engine_step(
    engine: Any, x: torch.Tensor, y: torch.Tensor, phases: list[tuple[float, float, float]]
) -> Callable[[], None]:
    """One timed training step of a ds or DeepSpeed engine (forward, backward, step)."""

    def step() -> None:
        t0 = time.perf_counter()
        loss = engine(x, y)
        t1 = time.perf_counter()
        engine.backward(loss)
        t2 = time.perf_counter()
        engine.step()
        phases.append((t1 - t0, t2 - t1, time.perf_counter() - t2))

    return step


def main() -> None:
    impl, stage, offload, steps, out = (
        sys.argv[1],
        int(sys.argv[2]),
        sys.argv[3] == "1",
        int(sys.argv[4]),
        sys.argv[5],
    )
    torch.set_num_threads(1)
    phases: list[tuple[float, float, float]] = []
    if impl == "ds":
        import ds.full
    elif impl == "deepspeed":
        import deepspeed
    # Interpreter + framework imports, before any model memory: subtracted to compare training state.
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    torch.manual_seed(0)
    model = GPT(VOCAB, D, LAYERS, HEADS, SEQ)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (MICRO, SEQ), generator=g)
    y = torch.randint(0, VOCAB, (MICRO, SEQ), generator=g)

    if impl == "ddp":
        dist.init_process_group("gloo")
        t0 = time.perf_counter()
        net = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4, weight_decay=0.01)
        init_s = time.perf_counter() - t0

        def step() -> None:
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = net(x, y)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            phases.append((t1 - t0, t2 - t1, time.perf_counter() - t2))

        def flush() -> None:
            return None
    elif impl == "ds":
        import ds.full as ds

        ds.init_distributed()
        t0 = time.perf_counter()
        engine, *_ = ds.initialize(model=model, config=config(stage, offload))
        init_s = time.perf_counter() - t0
        step = _engine_step(engine, x, y, phases)

        def flush() -> None:
            # Stages 1-2 leave the parameter all-gather in flight after step(); waiting for it
            # here charges it to the timed steps.
            engine.synchronize_parameters()
    else:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        t0 = time.perf_counter()
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=config(stage, offload)
        )
        init_s = time.perf_counter() - t0
        step = _engine_step(engine, x, y, phases)

        def flush() -> None:
            return None

    for _ in range(WARMUP):
        step()
    flush()
    phases.clear()
    # Steps run back to back (no barrier between them: a barrier would also absorb communication
    # an implementation leaves in flight across step boundaries); the last step includes waiting
    # for anything still in flight.
    dist.barrier()
    times = []
    t = time.perf_counter()
    for i in range(steps):
        step()
        if i == steps - 1:
            flush()
        now = time.perf_counter()
        times.append(now - t)
        t = now
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rss_all: list = [None] * dist.get_world_size()
    dist.all_gather_object(rss_all, (rss, base_rss))
    if dist.get_rank() == 0:
        Path(out).write_text(
            json.dumps(
                {
                    "times_s": times,
                    "init_s": init_s,
                    "rss": [r for r, _ in rss_all],
                    "train_rss": [r - b for r, b in rss_all],
                    "params": sum(p.numel() for p in model.parameters()),
                    # rank 0's forward / backward / step seconds per timed step
                    "phases": phases,
                }
            )
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    main()
