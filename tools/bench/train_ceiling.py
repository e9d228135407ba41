"""One rank's training step of tools/bench/train.py's 27.4M GPT against the GEMM ceiling, timed in
CPU seconds as well as wall seconds, so that a busy shared machine does not hide the distance.

    .venv/bin/python tools/bench/train_ceiling.py [--steps 4] [--stage 0]

ds.full.initialize at world 1 (gloo), one thread, micro-batch 4 x seq 128, fp32, AdamW: the
computation one rank of the world-2 benchmark does, without its communication, with ds's default
host Adam (torch's fused CPU kernel; the world-2 benchmark sets ``torch_adam`` to match DDP's
torch.optim.AdamW). ``mfu_cpu`` is the
model FLOPs per step (PaLM's count) over the process's CPU seconds per step and the 1-thread fp32
GEMM ceiling (``ds bench peak``, itself timed in CPU seconds); ``mfu_wall`` uses wall seconds.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench, gemm_ceiling
from train import training_ceiling
from train_worker import GPT, HEADS, LAYERS, MICRO, SEQ, VOCAB, D, config


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--stage", type=int, default=0, choices=(0, 1, 2))
    args = p.parse_args()
    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    os.environ.update(MASTER_PORT=str(port), DS_ACCELERATOR="cpu")
    import ds.full as ds

    ds.init_distributed()
    torch.manual_seed(0)
    cfg = config(args.stage, False)
    cfg["optimizer"]["params"].pop("torch_adam")
    engine, *_ = ds.initialize(model=GPT(VOCAB, D, LAYERS, HEADS, SEQ), config=cfg)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (MICRO, SEQ), generator=g)
    y = torch.randint(0, VOCAB, (MICRO, SEQ), generator=g)
    wall, cpu = [], []
    for i in range(2 + args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        engine.backward(engine(x, y))
        engine.step()
        if i >= 2:  # after 2 warm-up steps
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    step_flops = training_ceiling()[0] / 2  # one rank's half of the world-2 step
    peak = gemm_ceiling(threads=1)
    bench = Bench("train_ceiling", unit="s")
    bench.add(
        f"ds ZeRO-{args.stage}, world 1",
        "GPT 27.4M, micro-batch 4, fp32, 1 thread (one rank's computation)",
        wall,
        cpu_s=statistics.median(cpu),
        mfu_wall=step_flops / statistics.median(wall) / peak,
        mfu_cpu=step_flops / statistics.median(cpu) / peak,
    )
    bench.report()
    print(
        f"\nmodel FLOPs per step {step_flops / 1e9:.1f} GFLOP (PaLM's count); GEMM ceiling "
        f"{peak / 1e9:.1f} GFLOP/s (1 thread fp32, ds bench peak, CPU-time)"
    )


if __name__ == "__main__":
    main()
