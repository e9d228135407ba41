"""CPU Adam step on one shared parameter: ds CPUAdam vs DeepSpeedCPUAdam vs torch AdamW(fused).

All three step the same param and grad tensors (each keeps its own state), round-robin in one
process, the order reversed every other round. So the param's and grad's placement, and the
memory's speed at that moment, are the same for all three, and a per-round ratio compares the
kernels alone. Each worker process reports the median of its per-round ratios. The state is
still placed anew in every process, so the run repeats this in several fresh processes and
prints each one's medians and their median.

This resolves differences of a few percent that tools/bench/optim.py (one optimizer's buffers
against another's, in separate allocations) cannot.

ds and DeepSpeed keep fp32 moments by default (their ``fp32_optimizer_states=True``);
``--param-dtype-state`` keeps them in the param dtype, as torch always does.

DeepSpeed is optional: ``pip install deepspeed==0.19.8`` (DS_ACCELERATOR=cpu is set here);
without it the column is skipped with a note.

Run: .venv/bin/python tools/bench/optim_shared.py [--params 50000000] [--dtype float32]
     [--threads 1] [--rounds 11] [--processes 6] [--param-dtype-state]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench

DTYPES = ("float32", "bfloat16", "float16")
HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def worker(
    params: int, dtype_name: str, threads: int, rounds: int, fp32_states: bool
) -> dict[str, object]:
    """Times every implementation on one shared param; returns times and per-round ratios."""
    import torch

    from ds.ops.optim import CPUAdam

    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter((torch.randn(params, generator=gen) * 0.01).to(dtype))
    p.grad = (torch.randn(params, generator=gen) * 0.001).to(dtype)
    hyper = dict(HYPER, adamw_mode=True, fp32_optimizer_states=fp32_states)
    opts: dict[str, torch.optim.Optimizer] = {"ds": CPUAdam([p], **hyper)}
    note = None
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except Exception as e:  # not installed, or its op builder failed
        note = f"DeepSpeed column skipped ({type(e).__name__}: {e})"
    else:
        opts["deepspeed"] = DeepSpeedCPUAdam([p], **hyper)
    opts["torch-fused"] = torch.optim.AdamW([p], fused=True, **HYPER)
    for opt in opts.values():  # warm-up: allocates each one's state
        opt.step()
    times: dict[str, list[float]] = {k: [] for k in opts}
    for r in range(rounds):
        for name in list(opts) if r % 2 == 0 else list(reversed(opts)):
            t0 = time.perf_counter()
            opts[name].step()
            times[name].append(time.perf_counter() - t0)
    ratios = {
        k: statistics.median(a / b for a, b in zip(times["ds"], times[k]))
        for k in times
        if k != "ds"
    }
    return {"times": times, "ratios": ratios, "note": note}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--params", type=int, default=50_000_000)
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument(
        "--param-dtype-state",
        action="store_true",
        help="ds and DeepSpeed keep the moments in the param dtype (default: fp32)",
    )
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per worker process")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in ("params", "threads", "rounds", "processes"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.worker:
        fp32_states = not args.param_dtype_state
        print(json.dumps(worker(args.params, args.dtype, args.threads, args.rounds, fp32_states)))
        return

    state = args.dtype if args.param_dtype_state else "float32"
    case = f"{args.params / 1e6:g}M {args.dtype} ({state} state), {args.threads} thread(s)"
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        "--params",
        str(args.params),
        "--dtype",
        args.dtype,
        "--threads",
        str(args.threads),
        "--rounds",
        str(args.rounds),
    ]
    if args.param_dtype_state:
        cmd.append("--param-dtype-state")
    runs = []
    for i in range(args.processes):
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            sys.exit(
                f"worker {i + 1} ran past --timeout {args.timeout:g} s; raise it or lower --params"
            )
        if proc.returncode != 0:
            sys.exit(f"worker {i + 1} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        run = json.loads(proc.stdout.strip().splitlines()[-1])
        runs.append(run)
        medians = {k: statistics.median(v) * 1e3 for k, v in run["times"].items()}
        print(
            f"process {i + 1}/{args.processes}: "
            + ", ".join(f"{k} {v:.1f} ms" for k, v in medians.items())
            + "; "
            + ", ".join(f"ds/{k} {v:.3f}" for k, v in run["ratios"].items()),
            flush=True,
        )
    if runs[0]["note"]:
        print(f"note: {runs[0]['note']}")

    bench = Bench("optim_shared", peer="ds")
    for impl in runs[0]["times"]:
        bench.add(impl, case, [t for run in runs for t in run["times"][impl]])
    print(f"\nper-round ratios, median per process, over {args.processes} processes ({case}):")
    for peer in runs[0]["ratios"]:
        per_process = [run["ratios"][peer] for run in runs]
        print(
            f"  ds/{peer}: median {statistics.median(per_process):.3f} "
            f"(range {min(per_process):.3f}-{max(per_process):.3f})"
        )
    bench.report()


if __name__ == "__main__":
    main()
