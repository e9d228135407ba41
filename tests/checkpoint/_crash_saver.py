"""The saving processes of test_crash.py.

Run as a script, this is a zygote: it imports torch and ds once, never runs a tensor operation
itself (so forking it is safe), and for each ``<directory> <first step> <ready file>`` line on
stdin forks a child that saves checkpoints in a loop, printing the child's pid. The test SIGKILLs
the child at a random moment.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.sharding import shard_state


def tensors(step: int) -> dict[str, torch.Tensor]:
    # Content derived from the step so a loaded checkpoint proves which save it came from.
    return {
        "a": torch.full((256, 1024), float(step)),  # 1 MiB
        "b": torch.arange(100_000, dtype=torch.float64) + step,
        "c": torch.full((1000,), step, dtype=torch.int32),
    }


def saver(directory: str, start: int, ready_file: str) -> None:
    torch.set_num_threads(1)
    eng = ShardedCheckpointEngine()
    with open(ready_file, "w"):
        pass  # the test starts its random kill delay from here
    step = start
    while True:
        state = shard_state(tensors(step), 0, 1)
        state.objects = {"step": step}
        eng.save(directory, f"step{step}", state, async_save=step % 2 == 0)
        step += 1


def zygote() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed children are reaped automatically
    for line in sys.stdin:
        directory, start, ready = line.split()
        pid = os.fork()
        if pid == 0:
            try:
                saver(directory, int(start), ready)
            finally:
                os._exit(1)
        print(pid, flush=True)


if __name__ == "__main__":
    zygote()
