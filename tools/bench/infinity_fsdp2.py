"""Larger than memory, the torch peer: the Llama sizes of infinity.py trained with FSDP2
(``fully_shard`` with ``CPUOffloadPolicy``) on one CPU rank, to find the largest that trains here.

    .venv/bin/python tools/bench/infinity_fsdp2.py --size 1b [--steps 3] [--seq-len 32] \
        [--overhead-gib 2] [--json out.json]

Each decoder block and the root are wrapped with ``fully_shard`` on a CPU device mesh (gloo,
world 1), ``offload_policy=CPUOffloadPolicy(pin_memory=False)`` (pinning needs an
accelerator); fp32, AdamW lr 1e-4 (weight decay 0, as
infinity.py's), the same batch each step. The worker is a fresh process with infinity.py's
environment, and its peaks are read the same way (VmHWM for the build and the steps separately).

The machine is shared, so a run may not push it into swap or the OOM killer: it does not start
when its predicted peak (16 B/parameter for fp32 parameters, gradients and AdamW moments, plus
``--overhead-gib`` for the runtime, activations and gathered copies) is above what
/proc/meminfo reports available minus ``--reserve-gib``; while it runs, the worker is killed
when its RSS passes that cap or the machine's available memory falls under 1 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from infinity import SIZES, available, hf_config, reset_peak, run_args, vm, worker_cmd, worker_env

GIB = 2**30


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    from transformers import LlamaForCausalLM

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    runtime = vm("VmRSS")
    t0 = time.perf_counter()
    # FSDP2 has no build-time partitioning: the model is whole in memory before it is sharded.
    model = LlamaForCausalLM(hf_config(args.size))
    params = sum(p.numel() for p in model.parameters())
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    # Pinning needs an accelerator ("Cannot access accelerator device when none is available").
    policy = CPUOffloadPolicy(pin_memory=False)
    for block in model.model.layers:
        fully_shard(block, mesh=mesh, offload_policy=policy)
    fully_shard(model, mesh=mesh, offload_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    build_s = time.perf_counter() - t0
    build_peak = vm("VmHWM")
    reset_peak()
    ids = torch.randint(0, SIZES[args.size]["vocab_size"], (1, args.seq_len))
    losses, times = [], []
    for _ in range(args.steps):
        t = time.perf_counter()
        opt.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
        print(f"step {len(times)}: loss {losses[-1]:.4f} in {times[-1]:.1f} s", flush=True)
    out = {"size": args.size, "params": params, "seq_len": args.seq_len, "losses": losses,
           "step_s": times, "build_s": build_s, "runtime_rss": runtime,
           "build_peak_rss": build_peak, "step_peak_rss": vm("VmHWM")}  # fmt: skip
    dist.destroy_process_group()
    Path(args.out).write_text(json.dumps(out))


def param_count(size: str) -> int:
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in LlamaForCausalLM(hf_config(size)).parameters())


def watched(cmd: list[str], cap: int) -> str | None:
    """Run ``cmd``; kill it when its RSS passes ``cap`` or the machine runs short. Why, if so."""
    proc = subprocess.Popen(cmd, env=worker_env())
    why = None
    while proc.poll() is None:
        try:
            rss = vm_of(proc.pid)
        except (FileNotFoundError, ProcessLookupError):
            break
        if rss > cap or available() < GIB:
            why = f"stopped at RSS {rss / GIB:.2f} GiB, {available() / GIB:.1f} GiB available"
            proc.send_signal(signal.SIGKILL)
        time.sleep(0.05)
    proc.wait()
    if why is None and proc.returncode:
        why = f"exit status {proc.returncode}"
    return why


def vm_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    ap = run_args(__doc__, "1b")
    ap.add_argument("--overhead-gib", type=float, default=2.0)
    ap.add_argument("--reserve-gib", type=float, default=3.0)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    n = param_count(args.size)
    predicted = 16 * n + args.overhead_gib * GIB
    avail = available()
    cap = avail - args.reserve_gib * GIB
    load = os.getloadavg()
    print(f"{args.size}: {n / 1e9:.2f}B params, predicted peak {predicted / GIB:.2f} GiB, "
          f"{avail / GIB:.1f} GiB available, cap {cap / GIB:.2f} GiB, load {load[0]:.1f}",
          flush=True)  # fmt: skip
    if predicted > cap:
        sys.exit(f"not started: predicted {predicted / GIB:.2f} GiB > cap {cap / GIB:.2f} GiB")
    out = Path(f"/tmp/ds-infinity-fsdp2-{os.getpid()}.json")
    try:
        why = watched(worker_cmd(__file__, args, out), int(cap))
        if why:
            sys.exit(f"{args.size}: {why}")
        res = json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)
    res.update(available=avail, load=load)
    print("| model | params | build (s) | step (s) | loss (same batch) | peak RSS build / steps "
          "(GiB) |\n|---|---|---|---|---|---|")  # fmt: skip
    print(f"| Llama {args.size} | {res['params'] / 1e9:.2f}B | {res['build_s']:.0f} | "
          f"{', '.join(f'{t:.1f}' for t in res['step_s'])} | "
          f"{' -> '.join(f'{x:.2f}' for x in res['losses'])} | "
          f"{res['build_peak_rss'] / GIB:.2f} / {res['step_peak_rss'] / GIB:.2f} |")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
