"""What a checkpoint engine does about its predecessors' crashes, and its approvals on load.

A saver killed at the wrong moment leaves one of:

* ``.tmp-<tag>/`` (died before the commit rename): never read; removed.
* ``.old-<tag>/`` with ``<tag>/`` present (died after the overwrite's second rename): removed.
  Without ``<tag>/`` (died between the two renames) it is the only copy: renamed back.
* ``.del-<tag>/`` (died while deleting): removed.
* ``latest.tmp.<pid>`` of a process that no longer runs (died replacing ``latest``): removed.
* ``<tag>/ledger_head.json.tmp.<pid>`` of a process that no longer runs (died copying a head):
  removed.
* a committed ``<tag>/`` with no ledger record (died after the rename, before recording it): the
  ledger gets a ``checkpoint_recovered`` record with the manifest's and files' SHA-256, so the
  ledger and the directory agree again and the auditor sees that it happened.
* a committed ``<tag>/`` whose ``ledger_head.json`` is missing or does not cover its ledger record
  (died between the record and the signed head's copy): the commit is completed, a head is signed
  over the ledger as it stands and written there, so ``ds checkpoint verify --ledger
  --public-key`` passes again.

Rank 0 does this once per checkpoint directory per engine, before its first save there. One
saving job per checkpoint directory is assumed (as for ``latest``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from ds.checkpoint import _format as fmt
from ds.checkpoint._fsutil import atomic_write_bytes
from ds.checkpoint._ledger_check import HEAD_FILE, SAVE_KINDS, kind_records
from ds.checkpoint.boundary import LOAD_CHECKPOINT, LOAD_OPTIMIZER_STATE
from ds.interfaces.errors import ApprovalRequiredError, CheckpointError
from ds.interfaces.logging import get_logger

log = get_logger(__name__)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale_tmp(name: str) -> bool:
    """``<file>.tmp.<pid>`` (an atomic replacement's temporary) of a process that is gone."""
    pid = name.rsplit(".", 1)[-1]
    return pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid))


def clean_stale(directory: str, keep_tmp: str | None = None) -> list[str]:
    """Remove (or restore) what crashed savers left in ``directory``; returns what was done."""
    done: list[str] = []
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return done
    for name in names:
        path = os.path.join(directory, name)
        doomed = name.startswith(".del-") or (name.startswith(".tmp-") and path != keep_tmp)
        if doomed and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"removed {name}")
        elif name.startswith(".old-") and os.path.isdir(path):
            tag = name[len(".old-") :]
            if os.path.isdir(os.path.join(directory, tag)):
                shutil.rmtree(path, ignore_errors=True)
                done.append(f"removed {name}")
            else:
                os.rename(path, os.path.join(directory, tag))
                done.append(f"restored {tag} from {name}")
        elif name.startswith(f"{fmt.LATEST}.tmp.") and _stale_tmp(name):
            os.unlink(path)
            done.append(f"removed {name}")
        elif not name.startswith(".") and os.path.isdir(path):
            for inner in os.listdir(path):
                if inner.startswith(f"{HEAD_FILE}.tmp.") and _stale_tmp(inner):
                    os.unlink(os.path.join(path, inner))
                    done.append(f"removed {name}/{inner}")
    if done:
        log.warning("cleaned up after a crashed checkpoint save", directory=directory, done=done)
    return done


def _save_records(path: str, records: int) -> dict[str, int]:
    """manifest SHA-256 -> index of its save (or recovery) record among the first ``records`` of
    the ledger at ``path`` (the writer's count: it verified the file when it opened it)."""
    known: dict[str, int] = {}
    for _, rec in kind_records(path, records, SAVE_KINDS):
        known.setdefault(str(rec["payload"].get("manifest_sha256")), int(rec["i"]))
    return known


def _head_covers(path: str, index: int) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return int(json.load(f)["size"]) > index
    except (OSError, ValueError, KeyError, TypeError):
        return False


def record_unrecorded(directory: str, ledger: Any) -> list[str]:
    """Complete every committed checkpoint in ``directory``: a recovery record for one the
    ledger lacks, a signed head covering its record for one whose ``ledger_head.json`` lacks it."""
    path = getattr(ledger, "path", None)
    if path is None or not hasattr(ledger, "set_head_sink"):
        return []  # not a ledger this process writes (or not ours to read)
    known = _save_records(path, len(ledger))
    recovered: list[str] = []
    headless: list[str] = []
    for tag in sorted(os.listdir(directory)):
        manifest = os.path.join(directory, tag, fmt.MANIFEST)
        if tag.startswith(".") or not os.path.isfile(manifest):
            continue
        with open(manifest, "rb") as f:
            data = f.read()
        sha = hashlib.sha256(data).hexdigest()
        if sha not in known:
            try:
                files = fmt.decode_manifest(data, manifest)["files"]
            except Exception:  # not ours to vouch for: leave it unrecorded
                continue
            known[sha] = ledger.record_training_event(
                "checkpoint_recovered",
                {
                    "directory": directory,
                    "tag": tag,
                    "manifest_sha256": sha,
                    "shard_sha256": {
                        n: str(i["sha256"]) for n, i in files.items() if i.get("sha256")
                    },
                    "reason": "committed checkpoint had no ledger record (its saver died after "
                    "the commit)",
                },
            )
            recovered.append(tag)
        if not _head_covers(os.path.join(directory, tag, HEAD_FILE), known[sha]):
            headless.append(tag)
    if recovered:
        log.warning("recorded committed checkpoints the ledger lacked", tags=recovered)
    if headless:
        text = (json.dumps(asdict(ledger.tree_head()), sort_keys=True) + "\n").encode()
        for tag in headless:
            atomic_write_bytes(os.path.join(directory, tag, HEAD_FILE), text)
        log.warning("completed the ledger heads of committed checkpoints", tags=headless)
    return recovered


def before_save(engine: Any, directory: str, tmp: str) -> None:
    """Rank 0, before a save: watched-environment approvals; once per directory, clean up
    crashed saves and record unrecorded commits."""
    if engine._boundary is not None and hasattr(engine._boundary, "check_env"):
        engine._boundary.check_env()  # a changed watched variable needs its approval first
    cleaned: set[str] = engine.__dict__.setdefault("_cleaned_dirs", set())
    if directory not in cleaned:
        cleaned.add(directory)
        clean_stale(directory, keep_tmp=tmp)
    recorded: set[str] = engine.__dict__.setdefault("_recorded_dirs", set())
    if engine._ledger is not None and directory not in recorded:
        recorded.add(directory)
        record_unrecorded(directory, engine._ledger)


def publish_head(ledger: Any, final: str) -> None:
    """After a save's record: sign a head covering it, into ``<tag>/ledger_head.json`` too.

    The ledger keeps rewriting that file with every later head (and its final one at close), so
    the run's last checkpoint always carries the run's latest head.
    """
    if not hasattr(ledger, "set_head_sink"):
        return
    ledger.set_head_sink(os.path.join(final, HEAD_FILE))
    ledger.tree_head()


def require_load(engine: Any, directory: str, tag: str | None, requests: Sequence[Any]) -> None:
    """Before a load: record unrecorded commits (a resume after a crash right after a commit
    starts here); with a mutation boundary, loading model (and optimizer) state needs approvals.
    A ``checkpoint_recovered`` record does not satisfy the ``recorded-checkpoint`` policy: the
    ledger never saw that save, so a person approves the load."""
    if engine.rank == 0 and engine._ledger is not None:
        recorded: set[str] = engine.__dict__.setdefault("_recorded_dirs", set())
        where = os.path.abspath(directory)
        if where not in recorded:
            recorded.add(where)
            try:
                record_unrecorded(where, engine._ledger)
            except Exception as exc:  # rank 0 alone: never diverge from the other ranks here
                log.warning("could not record unrecorded checkpoints", error=str(exc))
    boundary = engine._boundary
    if boundary is None:
        return
    err: tuple[bool, str] | None = None  # (a refused tag?, message)
    if engine.rank == 0:
        try:
            target = engine.checkpoint_dir(directory, tag)
            boundary.require(LOAD_CHECKPOINT, target)
            if any(str(r.name).startswith("optim.") for r in requests):
                boundary.require(LOAD_OPTIMIZER_STATE, target)
        except ApprovalRequiredError as exc:
            err = (False, str(exc))
        except fmt.CheckpointPathError as exc:  # a tag leaving the directory: nothing is read
            err = (True, str(exc))
        except CheckpointError:
            err = None  # the load itself names the missing checkpoint
    err = engine._bcast(err)
    if err is not None:
        raise (fmt.CheckpointPathError if err[0] else ApprovalRequiredError)(err[1])
