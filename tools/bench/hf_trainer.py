"""Transformers Trainer step time, world 2 (gloo, CPU): the stock Trainer (accelerate's DDP) vs
DsTrainer at ZeRO-2 and ZeRO-3, same random Llama and data, started by ``ds run``.

    .venv/bin/python tools/bench/hf_trainer.py [--steps 20] [--rounds 2] [--hidden 256 --layers 4]

Time per optimizer step is the Trainer's own ``train_runtime`` / steps (so start-up and saving are
outside it); rounds interleave the implementations so a noisy machine hits them alike.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "hf_trainer_llama.py"
DS = Path(sys.executable).with_name("ds")
CASES = [("hf-ddp", ["--plain"]), ("ds-zero2", ["--stage", "2"]), ("ds-zero3", ["--stage", "3"])]


def run_case(flags: list[str], args: argparse.Namespace) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [
            str(DS), "run", "--nproc", "2", str(EXAMPLE), *flags,
            "--steps", str(args.steps), "--global-batch", "8",
            "--hidden", str(args.hidden), "--layers", str(args.layers),
            "--output-dir", str(Path(tmp) / "o"), "--losses", str(out),
        ]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900)
        r = json.loads(out.read_text())
        return float(r["train_runtime_s"]) / int(r["steps"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args()
    times: dict[str, list[float]] = {name: [] for name, _ in CASES}
    for _ in range(args.rounds):
        for name, flags in CASES:
            times[name].append(run_case(flags, args))
    bench = Bench("hf_trainer", peer="hf-ddp")
    case = f"Llama h{args.hidden} L{args.layers}, world 2, global batch 8x16 tokens"
    for name, ts in times.items():
        bench.add(name, case, ts)
    bench.report()


if __name__ == "__main__":
    main()
