"""Rank 0 times out in a collective that rank 1 skipped, destroys the group and exits 3, all while
rank 1 is still alive (so the collective is still pending in gloo). Rank 1 waits for rank 0's
process to be gone, then exits 0; had rank 0 hung, rank 1 gives up after 60 s and exits 1.

argv: MODE (watchdog | context | handle) OUT_DIR
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

from ds import comm as dist

mode, out = sys.argv[1], Path(sys.argv[2])
dist.init_distributed(dist_backend="gloo", verbose=False)
rank = dist.get_rank()
t = torch.ones(4)
dist.all_reduce(t)
if rank == 1:
    deadline = time.monotonic() + 60
    while not (out / "rank0.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int((out / "rank0.pid").read_text())
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print("peer gone while its collective was pending", flush=True)
            sys.exit(0)
        time.sleep(0.05)
    print("peer still alive after 60 s", flush=True)
    sys.exit(1)

(out / "rank0.pid").write_text(str(os.getpid()))
try:
    if mode == "watchdog":
        dist.configure(watchdog={"timeout_s": 2.0, "poll_s": 0.2})
        dist.all_reduce(t)
    elif mode == "context":
        with dist.collective_timeout(2.0):
            dist.all_reduce(t)
    else:  # a plain async handle waited on with torch's bounded wait
        dist.all_reduce(t, async_op=True).wait(timeout=2.0)
except (dist.CollectiveTimeoutError, RuntimeError) as exc:
    print(f"timed out: {type(exc).__name__}: {exc}", flush=True)
finally:
    dist.destroy_process_group()
print("destroyed", flush=True)
sys.exit(3)
