"""ds.comm call overhead vs raw torch.distributed: all-reduce at 1 KiB and 64 MiB, world 2 (gloo).

Two ranks are spawned; each runs the same interleaved schedule (a block of ds calls, then a block of
torch calls, repeated), so drift on a shared machine hits both alike. A 1 KiB sample is the mean
of a block of back-to-back calls (a single call is below the timer's useful resolution on a noisy
machine); a 64 MiB sample is one call. Reported: medians, ratio ds/torch, and the extra
microseconds per call. ``ds+logger`` is ds.comm with the comms logger on (the cost of measuring), ``ds+watchdog`` with the
hang watchdog on (bounded waits).

    python tools/bench/comm_overhead.py [--rounds 30] [--block 200] [--big-rounds 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import Bench, free_port

SMALL, BIG = 1 << 10, 64 << 20


def _worker(out_path: str, rounds: int, block: int, big_rounds: int) -> None:
    import torch
    import torch.distributed as tdist

    from ds import comm as dist

    dist.init_distributed(verbose=False)
    rank = dist.get_rank()
    _ar = tdist.all_reduce

    def timed(fn, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    results: dict[str, dict[str, list[float]]] = {}
    for nbytes, n_rounds, inner in ((SMALL, rounds, block), (BIG, big_rounds, 1)):
        t = torch.ones(nbytes // 4)
        impls = {
            "ds": lambda t=t: dist.all_reduce(t),
            "torch": lambda t=t: _ar(t),
        }
        for fn in impls.values():
            timed(fn, max(2, inner // 10))
        samples: dict[str, list[float]] = {k: [] for k in impls}
        if nbytes == SMALL:
            samples["ds+logger"] = []
            samples["ds+watchdog"] = []
        for i in range(n_rounds):
            # Alternate who goes first so neither always runs right after a barrier.
            order = list(impls.items()) if i % 2 == 0 else list(reversed(impls.items()))
            for name, fn in order:
                dist.barrier()
                samples[name].append(timed(fn, inner))
            if nbytes == SMALL:
                dist.configure(comms_logger=True)
                dist.barrier()
                samples["ds+logger"].append(timed(impls["ds"], inner))
                dist.configure(comms_logger=False)
                dist.configure(watchdog=60)
                dist.barrier()
                samples["ds+watchdog"].append(timed(impls["ds"], inner))
                dist.configure(watchdog=False)
        results[str(nbytes)] = samples
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--block", type=int, default=200)
    p.add_argument("--big-rounds", type=int, default=8)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        _worker(args.worker, args.rounds, args.block, args.big_rounds)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "samples.json")
        port = str(free_port())
        procs = []
        for r in range(2):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r))
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")
            cmd = [sys.executable, __file__, "--worker", out, "--rounds", str(args.rounds)]
            cmd += ["--block", str(args.block), "--big-rounds", str(args.big_rounds)]
            procs.append(subprocess.Popen(cmd, env=env))
        if max(p.wait() for p in procs) != 0:
            print("a rank failed", file=sys.stderr)
            return 1
        with open(out) as f:
            results = json.load(f)
    bench = Bench("comm_overhead", peer="torch", unit="us")
    dispatch = _dispatch_cost(args.rounds, args.block * 5)
    for nbytes, label in (
        (SMALL, "all_reduce 1 KiB, world 2"),
        (BIG, "all_reduce 64 MiB, world 2"),
    ):
        samples = results[str(nbytes)]
        for impl, times in samples.items():
            bench.add(impl, label, times, work_bytes=nbytes)
        extra = statistics.median(samples["ds"]) - statistics.median(samples["torch"])
        print(f"{label}: ds - torch = {extra * 1e6:+.1f} us per call")
    label = "all_reduce 1 KiB, world 1 (dispatch only)"
    for impl, times in dispatch.items():
        bench.add(impl, label, times, work_bytes=SMALL)
    extra = statistics.median(dispatch["ds"]) - statistics.median(dispatch["torch"])
    print(f"{label}: ds - torch = {extra * 1e6:+.2f} us per call")
    bench.report()
    return 0


def _dispatch_cost(rounds: int, block: int) -> dict[str, list[float]]:
    """Per-call cost in one process (a world-1 gloo group): no peer to wait for, so the
    difference between ds and torch is the wrapper's own cost, free of cross-process noise."""
    import torch
    import torch.distributed as tdist

    from ds import comm as dist
    from ds.comm.env import free_port

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        os.environ.pop(key, None)
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_distributed(verbose=False)
    t = torch.ones(SMALL // 4)
    impls = {"ds": lambda: dist.all_reduce(t), "torch": lambda: tdist.all_reduce(t)}
    switches = {"ds+logger": {"comms_logger": True}, "ds+watchdog": {"watchdog": 60}}
    out: dict[str, list[float]] = {k: [] for k in [*impls, *switches]}
    for i in range(rounds + 2):
        order = list(impls.items()) if i % 2 == 0 else list(reversed(impls.items()))
        for name, fn in order:
            t0 = time.perf_counter()
            for _ in range(block):
                fn()
            if i >= 2:  # the first two rounds are warm-up
                out[name].append((time.perf_counter() - t0) / block)
        for name, on in switches.items():
            dist.configure(**on)
            t0 = time.perf_counter()
            for _ in range(block):
                impls["ds"]()
            if i >= 2:
                out[name].append((time.perf_counter() - t0) / block)
            dist.configure(**{k: False for k in on})
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    sys.exit(main())
