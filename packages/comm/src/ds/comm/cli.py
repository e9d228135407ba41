"""``ds bench comm``: latency, algbw and busbw of the main collectives over a range of sizes.

Registered as the ``bench.comm`` verb in the ``ds.cli`` entry-point group. Inside a distributed job
(``RANK``/``WORLD_SIZE`` set, e.g. under ``ds run``) every rank measures and rank 0 prints; started
alone it spawns ``--nproc`` local gloo ranks of itself.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20}
_UNITS.update({"MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30})


def parse_size(text: str) -> int:
    """'1K' -> 1024, '256MiB' -> 268435456, '4096' -> 4096."""
    t = text.strip().upper()
    num = t.rstrip("BKMGI")
    unit = t[len(num) :]
    if unit not in _UNITS or not num:
        raise argparse.ArgumentTypeError(f"cannot read size {text!r}; use e.g. 1K, 64M, 256MiB")
    return int(float(num) * _UNITS[unit])


def sizes_between(lo: int, hi: int, factor: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def build_parser() -> argparse.ArgumentParser:
    from ds.comm.bench import OPS

    p = argparse.ArgumentParser(
        prog="ds bench comm",
        description="Measure collective latency and bandwidth (ds.comm on torch.distributed).",
    )
    p.add_argument("--ops", default=",".join(OPS), help=f"comma list from {', '.join(OPS)}")
    p.add_argument("--min-size", type=parse_size, default=parse_size("1K"))
    p.add_argument("--max-size", type=parse_size, default=parse_size("256M"))
    p.add_argument("--factor", type=int, default=4, help="size step multiplier (default 4)")
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--nproc", type=int, default=2, help="local ranks to spawn when run alone")
    p.add_argument("--backend", default=None, help="process group backend (default: gloo on CPU)")
    p.add_argument(
        "--compare-torch",
        action="store_true",
        help="also run raw torch.distributed and print the ds/torch latency ratio",
    )
    p.add_argument("--json", default=None, help="write the rows as JSON to this file")
    return p


def _in_job() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _spawn(argv: list[str], nproc: int) -> int:
    from ds.comm.env import free_port

    port = str(free_port())
    procs = []
    for r in range(nproc):
        env = dict(os.environ)
        env.update(
            RANK=str(r),
            WORLD_SIZE=str(nproc),
            LOCAL_RANK=str(r),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )
        env.setdefault("OMP_NUM_THREADS", "1")
        out = None if r == 0 else subprocess.DEVNULL
        procs.append(
            subprocess.Popen([sys.executable, "-m", "ds.comm.cli", *argv], env=env, stdout=out)
        )
    rcs = [p.wait() for p in procs]
    return max(rcs)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.min_size > args.max_size:
        print("ds bench comm: --min-size is larger than --max-size", file=sys.stderr)
        return 2
    if not _in_job():
        return _spawn(argv, args.nproc)

    import torch

    from ds import comm as dist
    from ds.comm.bench import OPS, format_rows, run

    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        print(
            f"ds bench comm: unknown op(s) {unknown}; choose from {', '.join(OPS)}", file=sys.stderr
        )
        return 2
    dist.init_distributed(dist_backend=args.backend, verbose=False)
    sizes = sizes_between(args.min_size, args.max_size, args.factor)
    rows = run(
        dist,
        ops,
        sizes,
        trials=args.trials,
        warmup=args.warmup,
        compare_torch=args.compare_torch,
        dtype=getattr(torch, args.dtype),
    )
    if dist.get_rank() == 0:
        print(format_rows(rows, dist.get_world_size()), flush=True)
        if args.json:
            payload = [
                {
                    "op": r.op,
                    "bytes": r.nbytes,
                    "latency_s": r.latency_s,
                    "algbw_gbps": r.algbw / 1e9,
                    "busbw_gbps": r.busbw / 1e9,
                    "torch_latency_s": r.torch_latency_s,
                    "ratio_vs_torch": r.ratio,
                }
                for r in rows
            ]
            with open(args.json, "w") as f:
                json.dump(payload, f, indent=2)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
