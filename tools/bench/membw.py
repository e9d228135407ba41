"""Memory bandwidth of this machine: the physical floor later benchmarks compare against.

STREAM-style kernels on float32 arrays far larger than the caches, run with 1 thread and with all
threads (torch's intra-op pool), median of N after warm-up:

- copy:  a = b          (1 read + 1 write per element)
- scale: a = s * b      (1 read + 1 write)
- add:   a = b + c      (2 reads + 1 write)
- triad: a = b + s * c  (2 reads + 1 write)

Bytes counted are the bytes the kernel must move (no write-allocate traffic), as STREAM does.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from harness import Bench


def run(n_mib: int, repeat: int) -> Bench:
    n = n_mib * 1024 * 1024 // 4
    a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
    s = 3.0
    kernels = {
        "copy": (lambda: a.copy_(b), 2),
        "scale": (lambda: torch.mul(b, s, out=a), 2),
        "add": (lambda: torch.add(b, c, out=a), 3),
        "triad": (lambda: torch.add(b, c, alpha=s, out=a), 3),
    }
    bench = Bench("membw", unit="ms")
    threads = sorted({1, os.cpu_count() or 1})
    for t in threads:
        torch.set_num_threads(t)
        for name, (fn, arrays) in kernels.items():
            bench.measure(
                f"{t} thread{'s' if t > 1 else ''}",
                name,
                fn,
                repeat=repeat,
                warmup=2,
                work_bytes=arrays * n * 4,
            )
    return bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="size of each array in MiB")
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    run(args.mib, args.repeat).report()


if __name__ == "__main__":
    main()
