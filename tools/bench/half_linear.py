"""fp16- or fp32-weight linear layer on a decode step: ds's native kernel
(``ds.ops.half_linear.linear``, reading the weight in place and summing in fp32) against torch's
``F.linear``. With ``--weights fp16`` (the default): torch on the same fp16 weight (the path it
replaces) and torch's fp32 ``F.linear`` on an fp32 copy (the peer). With ``--weights fp32``: the
kernel and torch's fp32 ``F.linear`` (MKL) on the same fp32 weight and fp32 x.

The layer shapes of SmolLM2-135M (hidden 576, intermediate 1536: q/o 576x576, k/v 192x576,
gate/up 1536x576, down 576x1536), one step = one pass over all seven in each of ``--blocks``
blocks (each block its own weights), plus the 49152 x 576 output head with ``--head``, for
``--rows`` rows (the sequences of a decode batch), x in the weights' dtype. With one block the weights stay in the
caches between steps; with 30 (the model's layer count) a step streams them from L3 or memory as
the model's decode step does. The implementations are interleaved round by round; medians of
``--rounds`` rounds of the process's CPU time (one thread unless ``--threads``).

    python tools/bench/half_linear.py [--rounds 20] [--threads 1] [--rows 1 4 16] [--blocks 30]
        [--head] [--weights fp16|fp32]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from harness import Bench

from ds.ops import _C
from ds.ops.half_linear import linear

SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
HEAD = (49152, 576)


def step(fn, ws, xs):  # type: ignore[no-untyped-def]
    """One pass of ``fn(x, w)`` over every layer."""
    return lambda: [fn(x, w) for w, x in zip(ws, xs)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--blocks", type=int, default=30, help="copies of the seven layers")
    ap.add_argument("--head", action="store_true", help="add the 49152 x 576 output head")
    ap.add_argument("--weights", choices=("fp16", "fp32"), default="fp16")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    _C.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    shapes = SHAPES * args.blocks + ([HEAD] if args.head else [])
    halves = [(torch.randn(n, k, generator=g) * 0.05).half() for n, k in shapes]
    floats = [w.float() for w in halves]
    bench = Bench("half_linear", peer="torch fp32", unit="us")
    for m in args.rows:
        xs = [torch.randn(m, k, generator=g).half() for _, k in shapes]
        xf = [x.float() for x in xs]

        if args.weights == "fp32":
            fns = {"ds native fp32": step(linear, floats, xf),
                   "torch fp32": step(F.linear, floats, xf)}  # fmt: skip
        else:
            fns = {"ds native fp16": step(linear, halves, xs),
                   "torch fp16": step(F.linear, halves, xs),
                   "torch fp32": step(F.linear, floats, xf)}  # fmt: skip
        case = f"{m} rows, {args.blocks} block(s){' + head' if args.head else ''}"
        with torch.no_grad():
            bench.interleave(case, fns, rounds=args.rounds, clock=time.process_time)
    print(f"threads {args.threads}, weights {args.weights}, load average {os.getloadavg()}")
    bench.report()


if __name__ == "__main__":
    main()
