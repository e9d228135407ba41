"""Quantizer throughput: ds native kernels vs the pure-torch reference (same function, same bytes).

For each scheme, quantize and dequantize of a float32 tensor far larger than the caches, both
implementations interleaved round-robin (the machine's bandwidth drifts). GB/s counts the bytes
that must move: the float32 input plus the codes and per-group scales written (quantize), or read
plus the float32 output (dequantize). ``ds-native out=`` decodes into a reused buffer: no fresh
64 MiB allocation, so no page faults (the allocating calls of both implementations pay them).

``ds-native kernel`` is the same native kernel writing into reused code/scale buffers (the
allocating call pays page faults on a fresh output, as ``dequantize`` without ``out=`` does).
``bandwidth floor`` moves the same bytes in the same rounds with no arithmetic to speak of: one
pass reading the input (``amax``) and one writing an output of the output's size (``fill_``),
both into reused buffers; "x floor" is each implementation's median over the floor's median.

    python tools/bench/quant.py [--mib 64] [--group-size 128] [--threads 1 2] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(__file__))
from harness import Bench

from ds.ops import _C
from ds.ops.quant import SCHEMES, QuantizedTensor, native, reference


def _qbytes(q) -> int:  # type: ignore[no-untyped-def]
    zp = q.zero_points.numel() * 4 if q.zero_points is not None else 0
    return q.data.numel() * q.data.element_size() + q.scales.numel() * 4 + zp


def _per_floor(res: dict) -> None:  # type: ignore[type-arg]
    floor_s = res["bandwidth floor"].median_s
    for r in res.values():
        r.extra["x floor"] = r.median_s / floor_s


def _kernel_only(
    x: torch.Tensor, scheme: str, group_size: int, q: QuantizedTensor
) -> Callable[[], object]:
    s = SCHEMES[scheme]
    lib = native._lib()
    data = torch.empty_like(q.data.view(torch.uint8))
    scales = torch.empty_like(q.scales)
    if s.kind == "int":
        zps = torch.empty(scales.numel() if s.asym else 0)
        return lambda: lib.quant_int(
            x, group_size, s.bits, s.asym, s.qmin, s.qmax, data, scales, zps
        )
    e_bits = 4 if scheme == "fp8_e4m3" else 5
    return lambda: lib.quant_fp8(x, group_size, e_bits, data, scales)


def run(mib: int, group_size: int, threads: list[int], rounds: int, schemes: list[str]) -> Bench:
    n = mib * 1024 * 1024 // 4
    x = torch.randn(n)
    bench = Bench("quant", peer="torch-reference", unit="ms")
    for t in threads:
        torch.set_num_threads(t)
        _C.set_num_threads(t)
        for scheme in schemes:
            q = native.quantize(x, scheme, group_size)
            q_bytes = _qbytes(q)
            sink = torch.zeros(q_bytes, dtype=torch.uint8)
            case = f"quantize {scheme} {mib} MiB g{group_size} {t}t"
            res = bench.interleave(
                case,
                {
                    "bandwidth floor": lambda sink=sink: (x.amax(), sink.fill_(1)),
                    "ds-native": lambda s=scheme: native.quantize(x, s, group_size),
                    "ds-native kernel": _kernel_only(x, scheme, group_size, q),
                    "torch-reference": lambda s=scheme: reference.quantize(x, s, group_size),
                },
                rounds=rounds,
                warmup=1,
                work_bytes=n * 4 + q_bytes,
            )
            _per_floor(res)
            case = f"dequantize {scheme} {mib} MiB g{group_size} {t}t"
            out = torch.empty(n)
            res = bench.interleave(
                case,
                {
                    "bandwidth floor": lambda sink=sink, out=out: (sink.amax(), out.fill_(1.0)),
                    "ds-native": lambda q=q: native.dequantize(q),
                    "ds-native out=": lambda q=q, out=out: native.dequantize(q, out=out),
                    "torch-reference": lambda q=q: reference.dequantize(q),
                },
                rounds=rounds,
                warmup=1,
                work_bytes=n * 4 + q_bytes,
            )
            _per_floor(res)
    return bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mib", type=int, default=64, help="float32 input size in MiB")
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=list(SCHEMES))
    a = ap.parse_args()
    run(a.mib, a.group_size, a.threads, a.rounds, a.schemes).report()


if __name__ == "__main__":
    main()
