"""Quantized linear layer on a decode step: ds's native kernel (``ds.ops.quant.linear``, reading
the int8/int4 codes) against dequantizing first and a dense ``F.linear`` (the path it replaced),
with torch's fp32 ``F.linear`` on the unquantized weight as the peer.

The layer shapes of SmolLM2-135M (hidden 576, intermediate 1536: q/o 576x576, k/v 192x576,
gate/up 1536x576, down 576x1536), one step = one pass over all seven in each of ``--blocks``
blocks (each block its own weights), for 1, 4 and 12 rows (the sequences of a decode batch),
group size 32 (GGUF Q8_0/Q4_0 blocks). With one block the weights stay in the caches between
steps; with 30 (the model's layer count) a step streams them from L3 or memory as the model's
decode step does. The three implementations are interleaved round by round; medians of
``--rounds`` rounds of the process's CPU time (one thread unless ``--threads``; with more, the
CPU time of all of them).

    python tools/bench/quant_linear.py [--rounds 30] [--threads 1] [--rows 1 4 12] [--blocks 1]
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

from ds.ops import _C, quant
from ds.ops.quant.linear import linear

SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 12])
    ap.add_argument("--schemes", nargs="+", default=["int8_sym", "int4_sym"])
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=1, help="copies of the seven layers")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    _C.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    shapes = SHAPES * args.blocks
    weights = [torch.randn(n, k, generator=g) for n, k in shapes]
    bench = Bench("quant_linear", peer="torch fp32", unit="us")
    for scheme in args.schemes:
        qs = [quant.quantize(w, scheme, args.group_size) for w in weights]
        for m in args.rows:
            xs = [torch.randn(m, k, generator=g) for _, k in shapes]

            def native_step(qs=qs, xs=xs) -> None:  # type: ignore[no-untyped-def]
                for q, x in zip(qs, xs):
                    linear(x, q)

            def dequant_step(qs=qs, xs=xs) -> None:  # type: ignore[no-untyped-def]
                for q, x in zip(qs, xs):
                    F.linear(x, quant.dequantize(q))

            def fp32_step(xs=xs) -> None:  # type: ignore[no-untyped-def]
                for w, x in zip(weights, xs):
                    F.linear(x, w)

            fns = {"ds native": native_step, "dequantize + linear": dequant_step,
                   "torch fp32": fp32_step}  # fmt: skip
            case = f"{scheme} g{args.group_size}, {m} rows, {args.blocks} block(s)"
            bench.interleave(case, fns, rounds=args.rounds, clock=time.process_time)
    print(f"threads {args.threads}, load average {os.getloadavg()}")
    bench.report()


if __name__ == "__main__":
    main()
