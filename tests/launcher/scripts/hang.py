"""Rank 1 skips the second all-reduce and then stays busy elsewhere; rank 0 waits in it.

HANG_API=ds: through ds.comm with its watchdog (HANG_WATCHDOG seconds); HANG_EXIT=sys_exit
catches the CollectiveTimeoutError and calls sys.exit(1), as docs/comm.md advises, otherwise the
error propagates. HANG_API=torch: raw torch.distributed, whose wait is bounded by nothing but the
process group's own 30 minutes (or, with HANG_WAIT_S, by work.wait(timeout), after which
the interpreter hangs at exit). Rank 0 writes HANG_STAMP (a time.time()) as it enters the
collective that never completes.
"""

import datetime
import os
import sys
import time
from pathlib import Path

import torch

if os.environ["HANG_API"] == "ds":
    import ds.comm as dist

    dist.init_distributed(dist_backend="gloo", verbose=False)
    dist.configure(watchdog={"timeout_s": float(os.environ["HANG_WATCHDOG"]), "poll_s": 0.2})
else:
    import torch.distributed as dist

    dist.init_process_group("gloo")

rank = dist.get_rank()
t = torch.ones(4)
dist.all_reduce(t)
if rank == 0:
    Path(os.environ["HANG_STAMP"]).write_text(repr(time.time()))
    if os.environ.get("HANG_WAIT_S"):
        # torch's own bounded wait: raises, and then the interpreter hangs at exit in gloo's
        # destructor, which joins the worker thread still inside the collective.
        work = dist.all_reduce(t, async_op=True)
        work.wait(datetime.timedelta(seconds=float(os.environ["HANG_WAIT_S"])))
    elif os.environ.get("HANG_EXIT") == "sys_exit":
        try:
            dist.all_reduce(t)
        except dist.CollectiveTimeoutError as exc:
            print(f"giving up: {exc}", file=sys.stderr, flush=True)
            sys.exit(1)
    else:
        dist.all_reduce(t)
    print("rank 0 never gets here", flush=True)
else:
    print("rank 1 skipped the all-reduce", flush=True)
    time.sleep(600)  # busy elsewhere: a peer that never arrives
