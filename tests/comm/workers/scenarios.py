"""Rank worker for single-purpose scenarios. Usage: scenarios.py SCENARIO OUT_DIR [PORT]

Each rank writes OUT_DIR/rank<R>.json describing what it saw; the test asserts on it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch


def _write(out: Path, rank: int, payload: dict) -> None:
    tmp = out / f".rank{rank}.json"
    tmp.write_text(json.dumps(payload))
    tmp.rename(out / f"rank{rank}.json")


def discovery(out: Path, port: int) -> None:
    from ds import comm as dist

    env = dist.init_distributed(distributed_port=port, verbose=False)
    assert env is not None
    again = dist.init_distributed(distributed_port=port, verbose=False)  # idempotent
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    payload = {
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "local_rank": dist.get_local_rank(),
        "source": env.source,
        "master_addr": env.master_addr,
        "sum": t.item(),
        "second_call": again is None,
    }
    _write(out, env.rank, payload)
    dist.destroy_process_group()


def skip_collective(out: Path) -> None:
    from ds import comm as dist

    dist.init_distributed(verbose=False)
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.configure(watchdog={"timeout_s": 5.0, "poll_s": 0.2, "warn_after_s": 1.0})
    import logging

    warned: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warned.append(record.getMessage())

    wd_log = logging.getLogger("ds.comm.watchdog")
    wd_log.addHandler(_Keep(logging.WARNING))
    wd_log.setLevel(logging.WARNING)
    t = torch.ones(4)
    dist.all_reduce(t)  # #1: everybody
    dist.broadcast(t, src=0)  # #2: everybody
    big = torch.ones(1 << 20)  # 4 MiB of fp32
    if rank == world - 1:
        # The faulty rank skips #3 and waits (bounded) until the others have reported.
        _wait_for(out, range(world - 1), 40)
        _write(out, rank, {"skipped": True})
        os._exit(0)
    t0 = time.monotonic()
    try:
        dist.all_reduce(big)
        payload = {"error": None}
    except dist.CollectiveTimeoutError as exc:
        payload = {"error": str(exc), "type": type(exc).__name__}
    payload["elapsed"] = time.monotonic() - t0
    payload["warnings"] = warned
    _write(out, rank, payload)
    # Rank 0 hosts the rendezvous store the others read peers' positions from: stay up until
    # every rank has reported.
    _wait_for(out, range(world), 30)
    os._exit(0)  # the group is unusable after a timeout; do not wait in destroy


def _wait_for(out: Path, ranks: range, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if all((out / f"rank{r}.json").exists() for r in ranks):
            return
        time.sleep(0.1)


def timeout_without_watchdog(out: Path) -> None:
    from ds import comm as dist

    dist.init_distributed(verbose=False)
    rank = dist.get_rank()
    if rank == 1:
        deadline = time.monotonic() + 30
        while not (out / "rank0.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        _write(out, rank, {"skipped": True})
        os._exit(0)
    try:
        with dist.collective_timeout(2.0):
            dist.all_reduce(torch.ones(256))
        payload = {"error": None}
    except dist.CollectiveTimeoutError as exc:
        payload = {"error": str(exc)}
    payload["tap_after"] = dist.get_communicator().tap is None
    _write(out, rank, payload)
    os._exit(0)


def mismatch(out: Path) -> None:
    from ds import comm as dist

    dist.init_distributed(verbose=False)
    rank = dist.get_rank()
    dist.configure(check_consistency=True)
    seen = {}
    try:
        dist.all_reduce(torch.ones(4 + rank))
        seen["shape"] = None
    except dist.CommError as exc:
        seen["shape"] = str(exc)
    try:
        dist.all_gather_into_tensor(
            torch.zeros(8, dtype=torch.float32),
            torch.ones(4, dtype=torch.float32 if rank == 0 else torch.bfloat16),
        )
        seen["dtype"] = None
    except dist.CommError as exc:
        seen["dtype"] = str(exc)
    # A consistent call still works after the detections.
    t = torch.ones(3)
    dist.all_reduce(t)
    seen["after"] = t.tolist()
    dist.configure(check_consistency=False)
    _write(out, rank, seen)


def telemetry(out: Path) -> None:
    from ds import comm as dist
    from ds.interfaces.registry import get
    from ds.interfaces.telemetry import CommEvent, EventBus

    dist.init_distributed(verbose=False)
    rank, world = dist.get_rank(), dist.get_world_size()
    bus = EventBus()
    events: list[CommEvent] = []
    bus.subscribe(events.append, CommEvent)
    dist.configure(
        comms_logger={"enabled": True, "prof_all": False, "prof_ops": ["all_reduce"]},
        event_bus=bus,
    )
    # An instance from the registry (what a runtime uses) shares the process-wide logger.
    comm = get("ds.comm_backends", "torch")()
    for _ in range(3):
        comm.all_reduce(torch.ones(256))
    dist.all_gather_into_tensor(torch.zeros(64 * world), torch.ones(64))
    lg = dist.get_comms_logger()
    rows = lg.rows()
    text = dist.log_summary()
    dist.configure(comms_logger=False, event_bus=False)
    plain = dist.get_communicator().tap is None
    _write(
        out,
        rank,
        {
            "rows": rows,
            "events": [(e.op, e.message_bytes, e.group_size, e.rank) for e in events],
            "summary": text,
            "plain_after_off": plain,
        },
    )


def quant(out: Path) -> None:
    from ds import comm as dist
    from ds.interfaces.comm import ReduceOp
    from ds.interfaces.errors import ConfigError
    from ds.interfaces.kernels import QuantizedTensor
    from ds.interfaces.registry import get

    dist.init_distributed(verbose=False)
    rank, world = dist.get_rank(), dist.get_world_size()
    kernels = get("ds.kernels", "cpu")()
    n = 1000  # not a multiple of world * group_size: exercises the padding
    xs = [torch.randn(n, generator=torch.Generator().manual_seed(10 + r)) for r in range(world)]
    chunk = -(-n // world)
    report: dict = {}
    for scheme in ("int8_sym", "int8_asym", "int4_sym", "fp8_e4m3"):
        for op in (ReduceOp.SUM, ReduceOp.AVG):
            got = dist.all_to_all_quant_reduce(xs[rank], kernels, scheme, 64, op)
            exact = torch.stack(xs).double().sum(0)
            if op == ReduceOp.AVG:
                exact = exact / world
            full = torch.zeros(world * chunk, dtype=torch.float64)
            full[:n] = exact
            want = full[rank * chunk : (rank + 1) * chunk]
            # The same arithmetic done locally with the same kernels must match bit for bit.
            local = torch.zeros(chunk)
            for r in range(world):
                part = torch.zeros(world * chunk)
                part[:n] = xs[r]
                piece = part[rank * chunk : (rank + 1) * chunk]
                padded = torch.zeros(-(-chunk // 64) * 64)
                padded[:chunk] = piece
                q = kernels.quantize(padded, scheme, 64)
                q = QuantizedTensor(q.data, q.scales, q.zero_points, q.shape, 64, q.scheme)
                local += kernels.dequantize(q, torch.float32)[:chunk]
            if op == ReduceOp.AVG:
                local = local / world
            report[f"{scheme}/{op.value}"] = {
                "shape": list(got.shape),
                "max_err": (got.double() - want).abs().max().item(),
                "max_abs": want.abs().max().item(),
                "matches_local": bool(torch.equal(got, local)),
            }
    try:
        dist.all_to_all_quant_reduce(xs[rank], None)
        report["no_provider"] = None
    except ConfigError as exc:
        report["no_provider"] = str(exc)
    _write(out, rank, report)


def peer_dies(out: Path) -> None:
    from ds import comm as dist

    dist.init_distributed(verbose=False)
    rank = dist.get_rank()
    dist.configure(watchdog={"timeout_s": 20.0, "poll_s": 0.2})
    dist.barrier()
    if rank == 1:
        os._exit(3)  # dies without a word
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1024))
        payload = {"error": None}
    except dist.CommError as exc:
        payload = {"error": str(exc), "type": type(exc).__name__}
    payload["elapsed"] = time.monotonic() - t0
    _write(out, rank, payload)
    os._exit(0)


def healthy(out: Path) -> None:
    """The scenarios that leave the group usable, in one job: telemetry, mismatch, quant."""
    from ds import comm as dist

    for name in ("telemetry", "mismatch", "quant"):
        sub = out / name
        sub.mkdir(exist_ok=True)
        globals()[name](sub)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    scenario, out_dir = sys.argv[1], Path(sys.argv[2])
    if scenario == "discovery":
        discovery(out_dir, int(sys.argv[3]))
    else:
        globals()[scenario](out_dir)
