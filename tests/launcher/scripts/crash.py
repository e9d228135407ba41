"""Rank 1 fails (exit 7) after printing a line; the others would sleep for a minute."""

import os
import sys
import time
from pathlib import Path

rank = int(os.environ["RANK"])
restart = int(os.environ.get("DS_RESTART_COUNT", "0"))
crash_until = int(os.environ.get("CRASH_UNTIL_RESTART", "99"))
if rank == 1 and restart < crash_until:
    print(f"rank 1 giving up on attempt {restart}", flush=True)
    print("second to last line", file=sys.stderr, flush=True)
    Path(os.environ["CRASH_STAMP"]).write_text(repr(time.time()))
    if os.environ.get("CRASH_SIGNAL"):
        os.kill(os.getpid(), int(os.environ["CRASH_SIGNAL"]))
    sys.exit(7)
if restart >= crash_until:
    print(f"rank {rank} succeeded on attempt {restart}", flush=True)
    sys.exit(0)
time.sleep(60)
