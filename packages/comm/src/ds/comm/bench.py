"""Collective benchmarks shared by ``ds bench comm`` and tools/bench/comm_overhead.py.

Message size is the total buffer a collective moves, as in nccl-tests: the tensor of all-reduce
and broadcast, the gathered output of all-gather, the input of reduce-scatter and all-to-all.
Latency is the slowest rank's median over the trials; algbw = size / latency; busbw applies
:func:`ds.comm.comms_logger.bus_factor`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist

from ds.comm.comms_logger import bus_factor

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")

_t_all_gather = getattr(tdist, "all_gather_single", None) or tdist.all_gather_into_tensor
_t_reduce_scatter = getattr(tdist, "reduce_scatter_single", None) or tdist.reduce_scatter_tensor


@dataclass
class Row:
    op: str
    nbytes: int
    latency_s: float
    algbw: float  # bytes/s
    busbw: float
    torch_latency_s: float | None = None

    @property
    def ratio(self) -> float | None:
        if self.torch_latency_s is None or self.torch_latency_s <= 0:
            return None
        return self.latency_s / self.torch_latency_s


def make_call(
    api: Any, op: str, nbytes: int, world: int, dtype: torch.dtype = torch.float32
) -> Callable[[], None]:
    """A zero-argument closure running ``op`` of ``nbytes`` through ``api`` (ds.comm or torch)."""
    esize = torch.empty((), dtype=dtype).element_size()
    numel = max(world, (nbytes // esize) // world * world)
    is_torch = api is tdist
    if op == "all_reduce":
        t = torch.ones(numel, dtype=dtype)
        return lambda: api.all_reduce(t)
    if op == "broadcast":
        t = torch.ones(numel, dtype=dtype)
        return lambda: api.broadcast(t, 0)
    if op == "all_gather":
        out = torch.empty(numel, dtype=dtype)
        inp = torch.ones(numel // world, dtype=dtype)
        fn = _t_all_gather if is_torch else api.all_gather_into_tensor
        return lambda: fn(out, inp)
    if op == "reduce_scatter":
        inp = torch.ones(numel, dtype=dtype)
        out = torch.empty(numel // world, dtype=dtype)
        fn = _t_reduce_scatter if is_torch else api.reduce_scatter_tensor
        return lambda: fn(out, inp)
    if op == "all_to_all":
        inp = torch.ones(numel, dtype=dtype)
        out = torch.empty(numel, dtype=dtype)
        return lambda: api.all_to_all_single(out, inp)
    raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")


def time_calls(fn: Callable[[], None], trials: int, inner: int = 1) -> list[float]:
    """Per-call seconds: ``trials`` samples, each the mean of ``inner`` back-to-back calls."""
    out = []
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - t0) / inner)
    return out


def slowest_median(samples: list[float]) -> float:
    """Median of this rank's samples, maximised over ranks (the job runs at the slowest)."""
    med = torch.tensor([statistics.median(samples)], dtype=torch.float64)
    if tdist.is_initialized() and tdist.get_world_size() > 1:
        tdist.all_reduce(med, op=tdist.ReduceOp.MAX)
    return float(med.item())


def trials_for(nbytes: int, trials: int) -> tuple[int, int]:
    """(samples, calls per sample): many cheap calls for small messages, few for big ones."""
    if nbytes <= 64 << 10:
        return trials, 20
    if nbytes >= 64 << 20:
        return max(3, trials // 3), 1
    return trials, 1


def run(
    ds_comm: Any,
    ops: list[str],
    sizes: list[int],
    trials: int = 10,
    warmup: int = 2,
    compare_torch: bool = False,
    dtype: torch.dtype = torch.float32,
) -> list[Row]:
    world = tdist.get_world_size()
    rows = []
    for op in ops:
        for nbytes in sizes:
            ds_fn = make_call(ds_comm, op, nbytes, world, dtype)
            t_fn = make_call(tdist, op, nbytes, world, dtype) if compare_torch else None
            n, inner = trials_for(nbytes, trials)
            for _ in range(warmup):
                ds_fn()
                if t_fn is not None:
                    t_fn()
            ds_s: list[float] = []
            t_s: list[float] = []
            # Interleave the two so drift on a shared machine hits both alike.
            for _ in range(n):
                ds_s += time_calls(ds_fn, 1, inner)
                if t_fn is not None:
                    t_s += time_calls(t_fn, 1, inner)
            lat = slowest_median(ds_s)
            t_lat = slowest_median(t_s) if t_fn is not None else None
            algbw = nbytes / lat if lat > 0 else 0.0
            rows.append(Row(op, nbytes, lat, algbw, algbw * bus_factor(op, world), t_lat))
    return rows


def format_rows(rows: list[Row], world: int) -> str:
    from ds.comm._format import fmt_bytes

    head = ["op", "size", "latency (us)", "algbw (GB/s)", "busbw (GB/s)"]
    compare = any(r.torch_latency_s is not None for r in rows)
    if compare:
        head += ["torch (us)", "ds/torch"]
    table = [head]
    for r in rows:
        line = [
            r.op,
            fmt_bytes(r.nbytes),
            f"{r.latency_s * 1e6:.1f}",
            f"{r.algbw / 1e9:.3f}",
            f"{r.busbw / 1e9:.3f}",
        ]
        if compare:
            tl = r.torch_latency_s
            line += [f"{tl * 1e6:.1f}" if tl else "-", f"{r.ratio:.3f}x" if r.ratio else "-"]
        table.append(line)
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = [f"ds bench comm: world {world}, backend {tdist.get_backend()}"]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in table]
    lines.insert(2, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
