"""Rank worker for init_distributed cases. Usage: init_cases.py CASE; prints one JSON line."""

from __future__ import annotations

import json
import os
import sys

import torch


def single() -> dict:
    from ds import comm as dist

    env = dist.init_distributed(verbose=False)
    t = torch.ones(2)
    dist.all_reduce(t)
    tap = dist.get_communicator().tap
    return {
        "source": env.source,
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "sum": t.tolist(),
        "again": dist.init_distributed(verbose=False),
        "exported": [os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")],
        "watchdog_timeout": tap.watchdog.timeout_s if tap and tap.watchdog else None,
        "check_consistency": bool(tap and tap.check_consistency),
    }


def incomplete_then_torch_spelling() -> dict:
    from ds import comm as dist
    from ds.comm.env import free_port
    from ds.interfaces.errors import ConfigError

    out: dict = {}
    try:
        dist.init_distributed(verbose=False)
        out["error"] = None
    except ConfigError as exc:
        out["error"] = str(exc)
    for key in ("RANK",):
        os.environ.pop(key)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    t = torch.full((3,), 2.0)
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    out["after"] = t.tolist()
    out["initialized"] = dist.is_initialized()
    return out


def explicit() -> dict:
    from ds import comm as dist

    rank = int(os.environ["TEST_RANK"])
    config = {
        "comms_logger": {"enabled": True, "prof_all": True},
        "comm": {"watchdog": {"timeout_s": 12}},
    }
    env = dist.init_distributed(rank=rank, world_size=2, verbose=False, config=config)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    tap = dist.get_communicator().tap
    rows = dist.get_comms_logger().rows()
    return {
        "source": env.source,
        "rank": dist.get_rank(),
        "sum": t.item(),
        "watchdog_timeout": tap.watchdog.timeout_s,
        "logged": [(r["op"], r["count"]) for r in rows],
    }


if __name__ == "__main__":
    result = globals()[sys.argv[1]]()
    print(json.dumps(result), flush=True)
    from ds import comm

    if comm.is_initialized():
        comm.destroy_process_group()
