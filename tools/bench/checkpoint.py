"""Checkpoint save/load throughput: ds sharded engine vs torch.save/torch.load vs torch DCP.

Two real ranks (gloo), each holding half of a ``--gib`` GiB state as ZeRO-style flat shards (8
tensors per rank). Every implementation writes and reads the same bytes; each timed operation is
bracketed by barriers and the slowest rank's time counts. Implementations run round-robin so the
shared machine's noise hits them alike. Reads follow writes, so they come from the page cache for
every implementation alike.

    .venv/bin/python tools/bench/checkpoint.py [--gib 1.0] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _rank_main(rank: int, world: int, port: int, root: str, gib: float, rounds: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from ds.checkpoint.engine import ShardedCheckpointEngine
    from ds.interfaces import registry
    from ds.interfaces.checkpoint import LoadRequest, ShardedStateDict, ShardedTensor, TensorMeta

    comm = registry.get(registry.COMM_BACKENDS, "torch")()
    comm.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank, world, 600.0)
    n_tensors = 8
    per_rank = int(gib * (1 << 30)) // world
    numel = per_rank // 4 // n_tensors
    g = torch.Generator().manual_seed(rank)
    local = {f"flat.{i}": torch.randn(numel, generator=g) for i in range(n_tensors)}
    # Logical tensors are world * numel long; this rank holds [rank * numel, (rank + 1) * numel).
    state = ShardedStateDict()
    for name, t in local.items():
        state.tensors[name] = ShardedTensor(
            TensorMeta(name, (world * numel,), "float32"), rank * numel, t
        )
    requests = [LoadRequest(name, rank * numel, numel) for name in local]
    dcp_state = {f"rank{rank}.{k}": v for k, v in local.items()}  # distinct keys: every rank writes
    eng = ShardedCheckpointEngine(comm)
    try:  # the ds-ops-kernels async I/O writer, when that provider is installed
        from ds.checkpoint._writers import make_writer

        aio_eng: ShardedCheckpointEngine | None = ShardedCheckpointEngine(
            comm, writer=make_writer("aio")
        )
    except Exception as exc:  # reported; the other rows still run
        print(f"ds-aio skipped: {exc}", file=sys.stderr)
        aio_eng = None

    def timed(fn) -> float:  # type: ignore[no-untyped-def]
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - t0

    def clean(path: str) -> None:
        if rank == 0 and os.path.exists(path):
            shutil.rmtree(path)
        dist.barrier()

    impls = {
        "ds": (
            lambda: eng.save(os.path.join(root, "ds"), "t", state),
            lambda: eng.load(os.path.join(root, "ds"), "t", requests, rank_objects=False),
        ),
        "ds-async": (
            lambda: eng.save(os.path.join(root, "dsa"), "t", state, async_save=True),
            None,
        ),
        **(
            {
                "ds-aio": (
                    lambda: aio_eng.save(os.path.join(root, "dsaio"), "t", state),
                    None,
                )
            }
            if aio_eng is not None
            else {}
        ),
        "torch.save": (
            lambda: torch.save(local, os.path.join(root, "torch", f"rank{rank}.pt")),
            lambda: torch.load(os.path.join(root, "torch", f"rank{rank}.pt"), weights_only=True),
        ),
        "dcp": (
            lambda: dcp.save(dcp_state, checkpoint_id=os.path.join(root, "dcp")),
            lambda: dcp.load(
                {k: torch.empty_like(v) for k, v in dcp_state.items()},
                checkpoint_id=os.path.join(root, "dcp"),
            ),
        ),
    }
    os.makedirs(os.path.join(root, "torch"), exist_ok=True)
    times: dict[str, list[float]] = {f"{k} {op}": [] for k in impls for op in ("save", "load")}
    stall: list[float] = []
    for r in range(rounds + 1):  # round 0 warms up
        for name, (save, load) in impls.items():
            for d in ("ds", "dsa", "dsaio", "dcp"):
                clean(os.path.join(root, d))
            t = timed(save)
            if name == "ds-async":
                stall.append(t)  # what training waits for: staging + prepare
                t += timed(eng.wait)
            if r:
                times[f"{name} save"].append(t)
            if load is not None:
                t = timed(load)
                if r:
                    times[f"{name} load"].append(t)
    if rank == 0:
        out = {k: v for k, v in times.items() if v}
        out["ds-async stall"] = stall[1:]
        print("RESULT " + json.dumps({"bytes": per_rank * world, "times": out}), flush=True)
    comm.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--root", default=None)
    args = ap.parse_args()
    if args.rank is not None:
        _rank_main(args.rank, 2, args.port, args.root, args.gib, args.rounds)
        return
    sys.path.insert(0, str(HERE))
    from harness import Bench

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = tempfile.mkdtemp(prefix="ds-ckpt-bench-", dir=os.environ.get("DS_BENCH_TMP"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        __file__,
        "--gib",
        str(args.gib),
        "--rounds",
        str(args.rounds),
        "--port",
        str(port),
        "--root",
        root,
    ]
    procs = [
        subprocess.Popen([*cmd, "--rank", str(r)], stdout=subprocess.PIPE, text=True, env=env)
        for r in range(2)
    ]
    outs = [p.communicate()[0] for p in procs]
    shutil.rmtree(root, ignore_errors=True)
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed: {[p.returncode for p in procs]}")
    result = json.loads(next(ln for ln in outs[0].splitlines() if ln.startswith("RESULT "))[7:])
    nbytes = result["bytes"]
    bench = Bench("checkpoint", peer="dcp", unit="s")
    for key, ts in result["times"].items():
        impl, op = key.rsplit(" ", 1)
        bench.add(
            impl if impl != "ds-async" or op != "stall" else "ds-async (training stall)",
            f"{op} {nbytes / 2**30:.2f} GiB, 2 ranks"
            if op != "stall"
            else f"save {nbytes / 2**30:.2f} GiB, 2 ranks",
            ts,
            work_bytes=nbytes,
        )
    bench.report()


if __name__ == "__main__":
    main()
