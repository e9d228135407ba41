"""A saver that dies (SIGKILL) at one point of a checkpoint's commit, after the commit rename.

    python _commit_crasher.py LEDGER KEY DIRECTORY POINT

It saves tag ``a`` with a signed ledger, then tag ``b``, and kills itself at POINT of b's commit
(see POINTS). Exit status 3 means the point was never reached.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

import ds.checkpoint._recovery as recovery
import ds.checkpoint.engine as engine_mod
import ds.checkpoint.ledger as ledger_mod
from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.ledger import RunLedger
from ds.checkpoint.sharding import shard_state

POINTS = (
    "after_rename",  # b/ committed, latest still names a, nothing recorded
    "after_latest",  # latest names b, nothing recorded
    "after_record",  # checkpoint_save recorded, no head signed over it
    "before_head_copy",  # head signed into .heads, not yet copied into b/ledger_head.json
    "during_head_copy",  # b/ledger_head.json.tmp.<pid> written, not renamed
    "after_head",  # the commit finished
)


def state(step: int):  # type: ignore[no-untyped-def]
    s = shard_state({"w": torch.full((64,), float(step))}, 0, 1)
    s.objects = {"step": step}
    return s


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str, directory: str) -> None:
    b = os.path.join(directory, "b")
    fsync, latest = engine_mod.fsync_path, engine_mod.atomic_write_bytes
    publish, copy = recovery.publish_head, ledger_mod.atomic_write_bytes

    def fsync_path(path: str) -> None:
        if point == "after_rename" and os.path.abspath(path) == os.path.abspath(directory):
            die()
        fsync(path)

    def write_latest(path: str, data: bytes) -> None:
        latest(path, data)
        if point == "after_latest":
            die()

    def publish_head(ledger, final: str) -> None:  # type: ignore[no-untyped-def]
        if point == "after_record":
            die()
        publish(ledger, final)
        if point == "after_head":
            die()

    def copy_head(path: str, data: bytes) -> None:
        if path.startswith(b + os.sep) and point == "before_head_copy":
            die()
        if path.startswith(b + os.sep) and point == "during_head_copy":
            with open(f"{path}.tmp.{os.getpid()}", "wb") as f:
                f.write(data[: len(data) // 2])
            die()
        copy(path, data)

    engine_mod.fsync_path = fsync_path
    engine_mod.atomic_write_bytes = write_latest
    recovery.publish_head = publish_head
    ledger_mod.atomic_write_bytes = copy_head


def main() -> None:
    path, key, directory, point = sys.argv[1:5]
    assert point in POINTS, point
    led = RunLedger(path, signing_key=key)
    eng = ShardedCheckpointEngine(ledger=led)
    eng.save(directory, "a", state(1))
    led.record_training_event("step", {"step": 2})
    arm(point, directory)
    eng.save(directory, "b", state(2))
    sys.exit(3)


if __name__ == "__main__":
    main()
