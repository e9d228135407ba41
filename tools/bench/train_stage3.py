"""ZeRO stage 3 step time and peak RSS per rank: ds stage 3, + cpu offload, + NVMe offload vs
torch DDP, ds ZeRO-0, torch FSDP2 ``fully_shard`` (gloo) and DeepSpeed ZeRO-3 (when installed).
Same 27.4M-parameter GPT as tools/bench/train.py, world 2, one thread per rank.

    .venv/bin/python tools/bench/train_stage3.py [--steps 6] [--rounds 1] [--only ddp,ds3]

ds stage-3 models are built under ``ds.zero.Init`` (DeepSpeed's under ``deepspeed.zero.Init``).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench
from train import run_world2, training_ceiling

IMPLS = ["ddp", "ds0", "ds3", "ds3-cpu", "ds3-nvme", "fsdp2", "deepspeed3"]
LABELS = {
    "ddp": "torch DDP",
    "ds0": "ds ZeRO-0",
    "ds3": "ds ZeRO-3",
    "ds3-cpu": "ds ZeRO-3 + cpu offload",
    "ds3-nvme": "ds ZeRO-3 + nvme offload",
    "fsdp2": "torch FSDP2 fully_shard",
    "deepspeed3": "DeepSpeed ZeRO-3",
}


def run_case(impl: str, steps: int) -> dict | None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        args = [impl, str(steps), str(out), str(Path(tmp) / "nvme")]
        return run_world2("train_stage3_worker.py", args, out, 1200, LABELS[impl])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--only", default="")
    args = p.parse_args()
    impls = args.only.split(",") if args.only else IMPLS
    if importlib.util.find_spec("deepspeed") is None and "deepspeed3" in impls:
        print(
            "note: deepspeed is not installed; its row is skipped (pip install deepspeed==0.19.8)"
        )
        impls = [i for i in impls if i != "deepspeed3"]
    runs: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for impl in impls:
            r = run_case(impl, args.steps)
            if r is not None:
                runs.setdefault(impl, []).append(r)
    bench = Bench("train_stage3", peer="torch DDP", unit="s")
    step_flops, peak = training_ceiling()
    for impl, rs in runs.items():
        times = [t for r in rs for t in r["times_s"]]
        bench.add(
            LABELS[impl],
            "GPT 27.4M, world 2, micro-batch 4, fp32",
            times,
            peak_rss_gb=max(max(r["rss"]) for r in rs) / 1e9,
            mfu=step_flops / statistics.median(times) / peak,
        )
    bench.report()
    print(f"\nmfu: as tools/bench/train.py's, against {peak / 1e9:.1f} GFLOP/s (ds bench peak)")


if __name__ == "__main__":
    main()
