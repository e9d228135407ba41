"""Training step time, peak RSS per rank and initialize time: ds ZeRO 0/1/2/2+offload vs torch
DDP and DeepSpeed (when installed), same 27.4M-parameter GPT, world 2, one thread per rank.

    .venv/bin/python tools/bench/train.py [--steps 8] [--rounds 1]

Each implementation runs as its own 2-process job (gloo); rounds interleave implementations so a
noisy machine hits them alike. DeepSpeed is measured when ``import deepspeed`` works
(``pip install deepspeed==0.19.8``; run with DS_ACCELERATOR=cpu); otherwise its rows are skipped
with a note.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench, free_port, gemm_ceiling, gpt_train_flops_per_token

HERE = Path(__file__).resolve().parent
CASES = [
    ("ddp", 0, False),
    ("ds", 0, False),
    ("ds", 1, False),
    ("ds", 2, False),
    ("ds", 2, True),
    ("deepspeed", 0, False),
    ("deepspeed", 1, False),
    ("deepspeed", 2, False),
    ("deepspeed", 2, True),
]


def run_world2(worker: str, args: list[str], out: Path, timeout: float, name: str) -> dict | None:
    """Run ``worker args`` (a script beside this one) as the two ranks of a gloo world on this
    host, one thread each; the JSON it writes to ``out``, or None (with rank 0's output tail
    printed under ``name``) when a rank fails or nothing was written."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE="2",
        DS_ACCELERATOR="cpu",
    )
    procs = []
    for rank in range(2):
        env_r = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
        cmd = [sys.executable, str(HERE / worker), *args]
        procs.append(
            subprocess.Popen(cmd, env=env_r, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    logs = [p.communicate(timeout=timeout)[0].decode(errors="replace") for p in procs]
    if any(p.returncode for p in procs) or not out.exists():
        print(f"{name} failed:\n{logs[0][-3000:]}")
        return None
    return json.loads(out.read_text())


def run_case(impl: str, stage: int, offload: bool, steps: int) -> dict | None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        args = [impl, str(stage), "1" if offload else "0", str(steps), str(out)]
        name = f"{impl} stage {stage}{' offload' if offload else ''}"
        return run_world2("train_worker.py", args, out, 420, name)


def training_ceiling() -> tuple[float, float]:
    """``(model FLOPs per step, GEMM ceiling FLOP/s)`` of the world-2, one-thread-per-rank runs
    of the workers' GPT."""
    import torch
    from train_worker import GPT, HEADS, LAYERS, MICRO, SEQ, VOCAB, D

    with torch.device("meta"):
        model = GPT(VOCAB, D, LAYERS, HEADS, SEQ)
    embed = sum(p.numel() for m in (model.tok, model.pos) for p in m.parameters())
    params = sum(p.numel() for p in model.parameters())
    per_token = gpt_train_flops_per_token(params - embed, LAYERS, D, SEQ)
    return per_token * MICRO * SEQ * 2, 2 * gemm_ceiling(threads=1)


def label(impl: str, stage: int, offload: bool) -> str:
    if impl == "ddp":
        return "torch DDP"
    return f"{impl} ZeRO-{stage}{'+offload' if offload else ''}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--only", default="", help="comma list of impls (ddp,ds,deepspeed)")
    args = p.parse_args()
    have_deepspeed = importlib.util.find_spec("deepspeed") is not None
    cases = [c for c in CASES if have_deepspeed or c[0] != "deepspeed"]
    if args.only:
        cases = [c for c in cases if c[0] in args.only.split(",")]
    if not have_deepspeed:
        print(
            "note: deepspeed is not installed; its rows are skipped (pip install deepspeed==0.19.8)"
        )
    runs: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for case in cases:
            r = run_case(*case, args.steps)
            if r is not None:
                runs.setdefault(label(*case), []).append(r)
    bench = Bench("train", peer="torch DDP", unit="s")
    step_flops, peak = training_ceiling()
    for name, rs in runs.items():
        times = [t for r in rs for t in r["times_s"]]
        bench.add(
            name,
            f"GPT {rs[0]['params'] / 1e6:.1f}M, world 2, micro-batch 4, fp32",
            times,
            init_s=statistics.median(r["init_s"] for r in rs),
            peak_rss_gb=max(max(r["rss"]) for r in rs) / 1e9,
            train_rss_gb=max(max(r["train_rss"]) for r in rs) / 1e9,
            mfu=step_flops / statistics.median(times) / peak,
        )
    bench.report()
    print(
        f"\nmfu: model FLOPs per step ({step_flops / 1e9:.1f} GFLOP, PaLM's count) / median step "
        f"time / GEMM ceiling of 2 ranks x 1 thread fp32 ({peak / 1e9:.1f} GFLOP/s, ds bench peak)"
    )
    print("\nrank 0 phase medians (ms): forward / backward / step")
    for name, rs in runs.items():
        ph = [t for r in rs for t in r.get("phases", [])]
        if ph:
            med = [statistics.median(x[i] for x in ph) * 1e3 for i in range(3)]
            print(f"  {name:28s} {med[0]:8.1f} {med[1]:8.1f} {med[2]:8.1f}")


if __name__ == "__main__":
    main()
