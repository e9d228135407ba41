"""Exit while the watchdog thread is publishing: the heartbeat runs as fast as it can and the main
thread keeps issuing numbered collectives until the interpreter shuts down, without destroying the
group. The process must exit 0; a thread left inside a store call at shutdown aborts it."""

from __future__ import annotations

import time

import ds.comm as dist
from ds.comm.watchdog import Watchdog

dist.init_distributed(dist_backend="gloo", verbose=False)
watchdog = Watchdog(timeout_s=60.0, poll_s=1e-5)
end = time.perf_counter() + 0.3
while time.perf_counter() < end:
    watchdog.leave(watchdog.enter("all_reduce", 4, None))
print("done")
