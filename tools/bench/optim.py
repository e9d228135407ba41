"""CPU Adam step: ds.ops CPUAdam vs torch.optim.AdamW (fused / foreach) vs DeepSpeedCPUAdam.

ms/step for N parameters (default 50M) as one flat tensor and as 200 tensors, fp32 params with
fp32 state and bf16 params with bf16 state, at 1 and 2 threads. Every case also times a pure
bandwidth kernel with the same traffic (4 reads, 3 writes per element: param, grad, exp_avg,
exp_avg_sq read; param and both moments written) on the same buffers' sizes; "x floor" is each
optimizer's time over that kernel's, measured in the same interleaved rounds (memory bandwidth on
a shared machine drifts within seconds, so only interleaved numbers are compared). With 200
tensors the same kernel also runs over 4 lists of 200 tensors laid out like the optimizers'
("floor, same layout"); "x layout floor" is the time over that one (equal to "x floor" for one
tensor). For one flat tensor it also prints, per optimizer, which of its buffers (param, grad,
state) start at congruent addresses (ds.ops.placement), the placement that slows every
implementation's walk and that ds avoids for its own state.

DeepSpeed is optional: ``pip install deepspeed==0.19.8`` (CPU: DS_ACCELERATOR=cpu is set here);
without it the column is skipped with a note.

"torch fused / this" is torch.optim.AdamW(fused=True)'s time over each row's: above 1 means
faster than torch's fused step. The load average is printed at the start and the end.

Run: .venv/bin/python tools/bench/optim.py [--params 50000000] [--rounds 10] [--threads 1,2]
The 2-thread parity reading: --params 20000000 --threads 1,2 --dtypes float32 --tensors 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench

from ds.ops import cpu_optim
from ds.ops.optim import CPUAdam
from ds.ops.placement import congruent_pairs, zeros_apart

LR = 1e-3


def _deepspeed_adam() -> type | None:
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except Exception as e:  # not installed, or its op builder failed
        print(f"note: DeepSpeed column skipped ({type(e).__name__}: {e})")
        return None
    return DeepSpeedCPUAdam


def _split(n: int, parts: int) -> list[int]:
    base = n // parts
    return [base + (1 if i < n % parts else 0) for i in range(parts)]


def _make_params(
    n: int, tensors: int, dtype: torch.dtype, grads: list[torch.Tensor]
) -> list[torch.nn.Parameter]:
    out = []
    for size, g in zip(_split(n, tensors), grads, strict=True):
        p = torch.nn.Parameter(torch.empty(size, dtype=dtype).normal_())
        p.grad = g
        out.append(p)
    return out


def run_case(
    bench: Bench,
    n: int,
    tensors: int,
    dtype: torch.dtype,
    threads: int,
    rounds: int,
    ds_cls: type | None,
) -> None:
    torch.set_num_threads(threads)
    elem = torch.finfo(dtype).bits // 8
    work = 7 * elem * n  # bytes moved per step: 4 reads + 3 writes
    layout = "flat" if tensors == 1 else f"{tensors} tensors"
    state = "fp32 state" if dtype == torch.float32 else f"{str(dtype)[6:]} state"
    case = f"{n / 1e6:.0f}M {str(dtype)[6:]} params, {state}, {layout}, {threads} thr"
    grads = [torch.empty(s, dtype=dtype).normal_() for s in _split(n, tensors)]
    fns: dict[str, Callable[[], object]] = {}

    # The floor's buffers are placed apart (ds.ops.placement) so that it measures the memory, not
    # an unlucky placement: buffers at congruent addresses stream up to 2.8x slower.
    floor: list[torch.Tensor] = []
    for _ in range(4):
        floor.append(zeros_apart((n,), dtype, floor).normal_())
    fns["bandwidth floor"] = lambda: cpu_optim.stream_4r3w(*floor)
    if tensors > 1:
        # The same kernel over the optimizer's layout: as many tensors of the same sizes,
        # allocated in the order the optimizers' buffers are (grads, params, then the two moments
        # of each param in turn), so the allocator places them alike.
        sizes = _split(n, tensors)
        lb = [torch.empty(s, dtype=dtype).normal_() for s in sizes]
        la = [torch.empty(s, dtype=dtype).normal_() for s in sizes]
        lc, ld = [], []
        for s in sizes:
            lc.append(torch.empty(s, dtype=dtype).normal_())
            ld.append(torch.empty(s, dtype=dtype).normal_())
        fns["floor, same layout"] = lambda: cpu_optim.stream_4r3w(la, lb, lc, ld)

    fp32_states = dtype == torch.float32
    ours = CPUAdam(_make_params(n, tensors, dtype, grads), lr=LR, fp32_optimizer_states=fp32_states)
    fns["ds CPUAdam"] = ours.step
    fused = torch.optim.AdamW(_make_params(n, tensors, dtype, grads), lr=LR, fused=True)
    fns["torch fused"] = fused.step
    foreach = torch.optim.AdamW(_make_params(n, tensors, dtype, grads), lr=LR, foreach=True)
    fns["torch foreach"] = foreach.step
    if ds_cls is not None:
        dsa = ds_cls(
            _make_params(n, tensors, dtype, grads), lr=LR, fp32_optimizer_states=fp32_states
        )
        fns["DeepSpeedCPUAdam"] = dsa.step

    res = bench.interleave(case, fns, rounds=rounds, warmup=2, work_bytes=work)
    if tensors == 1:
        # Which of each optimizer's buffers ended up at congruent addresses (the caller's
        # allocator decides for params and grads, each optimizer for its state).
        opts = {"ds CPUAdam": ours, "torch fused": fused, "torch foreach": foreach}
        if ds_cls is not None:
            opts["DeepSpeedCPUAdam"] = dsa
        for name, opt in opts.items():
            p = opt.param_groups[0]["params"][0]
            named = [("param", p), ("grad", p.grad)]
            named += [(k, v) for k, v in opt.state[p].items() if torch.is_tensor(v)]
            pairs = congruent_pairs(named)
            print(f"  placement, {name}: " + (", ".join("~".join(x) for x in pairs) or "apart"))
    floor_s = res["bandwidth floor"].median_s
    layout_s = res["floor, same layout"].median_s if tensors > 1 else floor_s
    fused_s = res["torch fused"].median_s
    for r in res.values():
        r.extra["x floor"] = r.median_s / floor_s
        r.extra["x layout floor"] = r.median_s / layout_s
        # > 1: faster than torch.optim.AdamW(fused=True) in the same interleaved rounds.
        r.extra["torch fused / this"] = fused_s / r.median_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--params", type=int, default=50_000_000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--tensors", default="1,200")
    args = ap.parse_args()

    import ds.ops

    print("ds.ops:", ds.ops.info())
    # The machine may be shared: say how loaded it was, before and after.
    print("load average (1, 5, 15 min) at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    ds_cls = _deepspeed_adam()
    bench = Bench("optim", peer="bandwidth floor")
    t0 = time.perf_counter()
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for tensors in (int(t) for t in args.tensors.split(",")):
            for threads in (int(t) for t in args.threads.split(",")):
                run_case(bench, args.params, tensors, dtype, threads, args.rounds, ds_cls)
                print(
                    f"  done: {dtype_name}, {tensors} tensors, {threads} thr "
                    f"({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
    print("load average (1, 5, 15 min) at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    bench.report()


if __name__ == "__main__":
    main()
