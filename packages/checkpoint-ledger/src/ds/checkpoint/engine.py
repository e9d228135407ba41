"""ShardedCheckpointEngine: atomic, optionally asynchronous, resharding-on-read checkpoints.

Save protocol (every rank calls ``save`` with its own shards):

1. prepare (collective): rank 0 removes a stale temporary directory ``<directory>/.tmp-<tag>``
   left by a crashed save, creates it, checks overwrite approval, and tells every rank to go on.
2. write (background thread when ``async_save``): each rank writes its shard file and per-rank
   objects into the temporary directory and fsyncs them; tensors were staged to host memory first,
   so training may modify its own tensors meanwhile.
3. commit (collective, on the calling thread): ranks exchange file names, byte layouts and SHA-256
   digests; rank 0 writes ``manifest.json`` (embedding the ledger's tree head), fsyncs files and the
   directory, renames the temporary directory to ``<directory>/<tag>``, fsyncs ``<directory>``,
   then atomically replaces ``latest``. A crash before the rename leaves only a temporary
   directory, which no reader looks at; a crash after it leaves a complete checkpoint.

Loading, resharding on read and verifying are :class:`ds.checkpoint._loading.CheckpointReading`'s
(mixed in); the shard file's byte layout is :mod:`ds.checkpoint._layout`'s.

With a communicator the commit step of an asynchronous save runs in :meth:`wait` (called by the
next ``save`` and at exit): collectives stay on the training thread, so a background thread never
interleaves its collectives with the training step's. Without one, the background thread commits.
"""

from __future__ import annotations

import atexit
import hashlib
import inspect
import io
import os
import shutil
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from ds.checkpoint import _format as fmt
from ds.checkpoint import _recovery, recovery_script
from ds.checkpoint._fsutil import atomic_write_bytes, fsync_path
from ds.checkpoint._layout import shard_layout as _layout
from ds.checkpoint._layout import validate_state as _validate
from ds.checkpoint._loading import CheckpointReading
from ds.checkpoint._progress import Progress
from ds.checkpoint._writers import PythonWriter, ShardWriter
from ds.interfaces.checkpoint import ShardedStateDict
from ds.interfaces.errors import ApprovalRequiredError, CheckpointError
from ds.interfaces.logging import get_logger

log = get_logger(__name__)

# A save still writing after this many seconds shows its progress (a bar on a terminal, else a
# line per tenth); shorter saves, the usual case, print nothing.
LONG_SAVE_S = 5.0


def _ds_version() -> str:
    try:
        from importlib.metadata import version

        return version("ds-checkpoint-ledger")
    except Exception:  # metadata missing in a source checkout: the manifest still records it
        return "unknown"


def _pickle_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class _RecordError(Exception):
    """Recording a committed save (ledger, events) failed."""


class _Handle:
    """SaveHandle for one save; ``wait`` re-raises a background error on the caller's thread."""

    def __init__(self, engine: ShardedCheckpointEngine, job: _SaveJob | None) -> None:
        self._engine = engine
        self._job = job

    def done(self) -> bool:
        return self._job is None or self._job.committed

    def wait(self) -> None:
        if self._job is not None:
            self._engine._finish(self._job)


class _SaveJob:
    def __init__(self, directory: str, tag: str, tmp: str) -> None:
        self.directory = directory
        self.tag = tag
        self.tmp = tmp
        self.thread: threading.Thread | None = None
        self.result: dict[str, Any] | None = None  # this rank's written files, or its error
        self.committed = False
        self.error: BaseException | None = None
        self.started = time.perf_counter()
        self.step = 0


class ShardedCheckpointEngine(CheckpointReading):
    """The default :class:`ds.interfaces.checkpoint.CheckpointEngine`.

    ``comm`` is a Communicator (None for a single process). ``ledger`` (optional) receives a
    ``checkpoint_save`` record per save and its tree head is embedded in every manifest. ``events``
    (optional EventBus) receives a CheckpointEvent per save/load. ``boundary`` (optional
    MutationBoundary) makes overwriting an existing tag require a recorded approval.
    """

    def __init__(
        self,
        comm: Any | None = None,
        *,
        writer: ShardWriter | None = None,
        checksum: bool = True,
        ledger: Any | None = None,
        events: Any | None = None,
        boundary: Any | None = None,
        async_save: bool = False,
        progress_after_s: float | None = LONG_SAVE_S,
    ) -> None:
        self._comm = comm
        self._progress_after_s = progress_after_s
        self._writer = writer or PythonWriter()
        self._checksum = checksum
        self._ledger = ledger
        self._events = events
        self._boundary = boundary
        self._default_async = async_save
        self._pending: _SaveJob | None = None
        # Host buffers of the last async save, reused by the next one (same shapes every step):
        # no page faults on fresh memory while training waits. Safe: a save waits for the last.
        self._staging: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()
        atexit.register(_wait_at_exit, weakref.ref(self))  # weak: engines may come and go

    # ------------------------------------------------------------------ ranks
    @property
    def rank(self) -> int:
        return 0 if self._comm is None else int(self._comm.get_rank())

    @property
    def world_size(self) -> int:
        return 1 if self._comm is None else int(self._comm.get_world_size())

    def _gather(self, obj: Any) -> list[Any]:
        if self._comm is None:
            return [obj]
        out: list[Any] = [None] * self.world_size
        self._comm.all_gather_object(out, obj)
        return out

    def _bcast(self, obj: Any) -> Any:
        if self._comm is None:
            return obj
        box = [obj]
        self._comm.broadcast_object_list(box, src=0)
        return box[0]

    # ------------------------------------------------------------------ save
    def save(
        self,
        directory: str,
        tag: str,
        state: ShardedStateDict,
        *,
        async_save: bool | None = None,
    ) -> _Handle:
        self.wait()  # the previous asynchronous save commits (or raises) first
        use_async = self._default_async if async_save is None else async_save
        _check_tag(tag)
        _validate(state)
        directory = os.path.abspath(directory)
        tmp = os.path.join(directory, f".tmp-{tag}")
        self._prepare(directory, tag, tmp)
        job = _SaveJob(directory, tag, tmp)
        step = state.objects.get("step", 0)
        job.step = int(step) if isinstance(step, int) else 0
        pieces, layout = _layout(state, self._staging if use_async else None)
        objects = _pickle_bytes(state.objects) if self.rank == 0 else None
        rank_objects = _pickle_bytes(state.rank_objects)
        if not use_async:
            job.result = self._write(job, pieces, layout, objects, rank_objects)
            self._finish(job)
            return _Handle(self, None)

        def work() -> None:
            job.result = self._write(job, pieces, layout, objects, rank_objects)
            if self._comm is None:
                self._commit_guarded(job)

        job.thread = threading.Thread(target=work, name=f"ds-ckpt-save-{tag}", daemon=True)
        with self._lock:
            self._pending = job
        job.thread.start()
        return _Handle(self, job)

    def _on_rank0(
        self, action: Callable[[], None], failure: str, detail: Callable[[Exception], str] = str
    ) -> None:
        """Run ``action`` on rank 0 alone and raise what it raised on every rank: a refused
        approval as itself, anything else as a CheckpointError ``"{failure}: {detail(exc)}"``."""
        err: tuple[bool, str] | None = None  # (a refused approval?, message)
        if self.rank == 0:
            try:
                action()
            except ApprovalRequiredError as exc:
                err = (True, str(exc))
            except Exception as exc:
                err = (False, detail(exc))
        err = self._bcast(err)
        if err is not None:
            if err[0]:
                raise ApprovalRequiredError(err[1])
            raise CheckpointError(f"{failure}: {err[1]}")

    def _prepare(self, directory: str, tag: str, tmp: str) -> None:
        def prepare() -> None:
            os.makedirs(directory, exist_ok=True)
            _recovery.before_save(self, directory, tmp)
            if self._boundary is not None and os.path.isdir(os.path.join(directory, tag)):
                self._boundary.require("overwrite_checkpoint", os.path.join(directory, tag))
            if os.path.exists(tmp):
                shutil.rmtree(tmp)  # left by a save that crashed before its commit
            os.makedirs(tmp)

        self._on_rank0(
            prepare,
            f"rank 0 could not prepare checkpoint {tag!r}",
            lambda exc: f"{type(exc).__name__}: {exc}",
        )

    def _write(
        self,
        job: _SaveJob,
        pieces: list[tuple[int, torch.Tensor]],
        layout: dict[str, dict[str, Any]],
        objects: bytes | None,
        rank_objects: bytes,
    ) -> dict[str, Any]:
        """Write this rank's files into the temporary directory; never raises (errors travel)."""
        rank, world = self.rank, self.world_size
        try:
            files: dict[str, dict[str, Any]] = {}
            shard = fmt.shard_file(rank, world)
            size = pieces[-1][0] + int(pieces[-1][1].numel()) if pieces else 0
            path = os.path.join(job.tmp, shard)
            if self._reports_progress():
                progress = Progress(
                    f"checkpoint save {job.tag}", size, "B", after_s=self._progress_after_s or 0
                )
                sha = self._writer.write(path, pieces, self._checksum, progress=progress)
            else:
                sha = self._writer.write(path, pieces, self._checksum)
            files[shard] = {"bytes": size, "sha256": sha}
            blobs = [(fmt.rank_objects_file(rank), rank_objects)]
            if objects is not None:
                blobs.append((fmt.OBJECTS, objects))
            for name, data in blobs:
                path = os.path.join(job.tmp, name)
                with open(path, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                digest = hashlib.sha256(data).hexdigest() if self._checksum else None
                files[name] = {"bytes": len(data), "sha256": digest}
            for entry in layout.values():
                entry["file"] = shard
            return {"ok": True, "files": files, "layout": layout}
        except BaseException as exc:  # reported to every rank by the commit step
            return {"ok": False, "error": f"rank {rank}: {type(exc).__name__}: {exc}"}

    def _reports_progress(self) -> bool:
        """Rank 0 shows a long save's progress (its shard stands for all: ranks write alike)."""
        if self._progress_after_s is None or self.rank != 0:
            return False
        try:  # a writer of the user's own may take no progress callback
            return "progress" in inspect.signature(self._writer.write).parameters
        except (TypeError, ValueError):
            return False

    def _finish(self, job: _SaveJob) -> None:
        if job.thread is not None:
            job.thread.join()
        with self._lock:
            if self._pending is job:
                self._pending = None
        if not job.committed and job.error is None:
            self._commit_guarded(job)
        if job.error is not None:
            err, job.error = job.error, None  # raised once, on the first wait
            job.committed = True
            raise err

    def _commit_guarded(self, job: _SaveJob) -> None:
        try:
            self._commit(job)
        except BaseException as exc:
            job.error = exc
        job.committed = job.error is None

    def _commit(self, job: _SaveJob) -> None:
        assert job.result is not None
        results = self._gather(job.result)
        errors = [r["error"] for r in results if not r["ok"]]
        status: tuple[bool, str] | None = None  # (committed anyway, message)
        if self.rank == 0:
            if errors:
                shutil.rmtree(job.tmp, ignore_errors=True)
                status = (False, "; ".join(errors))
            else:
                try:
                    self._publish(job, results)
                except _RecordError as exc:
                    status = (True, str(exc))
                except Exception as exc:
                    status = (False, f"rank 0 commit: {type(exc).__name__}: {exc}")
        status = self._bcast(status)
        if status is not None:
            committed, message = status
            if committed:
                raise CheckpointError(
                    f"checkpoint {job.tag!r} in {job.directory} is saved and loadable, but "
                    f"recording it failed: {message}"
                )
            raise CheckpointError(
                f"checkpoint {job.tag!r} in {job.directory} was not saved ({message}); "
                "the previous checkpoint is untouched"
            )

    def _publish(self, job: _SaveJob, results: list[dict[str, Any]]) -> None:
        """Rank 0: write the manifest, make everything durable, rename, update ``latest``."""
        tensors: dict[str, dict[str, Any]] = {}
        files: dict[str, Any] = {}
        for r in results:
            files.update(r["files"])
            for name, entry in r["layout"].items():
                t = tensors.setdefault(
                    name, {"shape": entry["shape"], "dtype": entry["dtype"], "shards": []}
                )
                if t["shape"] != entry["shape"] or t["dtype"] != entry["dtype"]:
                    raise CheckpointError(
                        f"ranks disagree on tensor {name!r}: shape/dtype {t['shape']}/{t['dtype']} "
                        f"vs {entry['shape']}/{entry['dtype']}"
                    )
                t["shards"].append(
                    fmt.ShardEntry(
                        entry["file"], entry["offset"], entry["numel"], entry["byte_offset"]
                    ).to_json()
                )
        for t in tensors.values():
            t["shards"].sort(key=lambda s: (s["offset"], s["file"]))
        head = None
        if self._ledger is not None:
            head = asdict(self._ledger.tree_head())
        manifest = {
            "format": fmt.FORMAT_NAME,
            "format_version": fmt.FORMAT_VERSION,
            "tag": job.tag,
            "world_size": self.world_size,
            "ds_version": _ds_version(),
            "tensors": tensors,
            "files": files,
            "ledger_head": head,
        }
        data = fmt.encode_manifest(manifest)
        with open(os.path.join(job.tmp, fmt.MANIFEST), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        fsync_path(job.tmp)
        final = os.path.join(job.directory, job.tag)
        old = os.path.join(job.directory, f".old-{job.tag}")
        if os.path.exists(final):
            if os.path.exists(old):
                shutil.rmtree(old)
            os.rename(final, old)  # readers fall back to .old-<tag> if a crash lands here
        os.rename(job.tmp, final)
        fsync_path(job.directory)
        atomic_write_bytes(os.path.join(job.directory, fmt.LATEST), job.tag.encode())
        if os.path.exists(old):
            shutil.rmtree(old)
        manifest_sha = hashlib.sha256(data).hexdigest()
        shard_sha = {name: str(f["sha256"]) for name, f in files.items() if f["sha256"]}
        duration = time.perf_counter() - job.started
        written = sum(int(f["bytes"]) for f in files.values()) + len(data)
        try:
            self._record_save(job, manifest_sha, shard_sha, written, duration)
            if self._ledger is not None:
                _recovery.publish_head(self._ledger, final)  # a signed head covers the record
        except Exception as exc:  # the checkpoint itself is committed at this point
            raise _RecordError(f"{type(exc).__name__}: {exc}") from exc
        log.info("checkpoint saved", tag=job.tag, directory=job.directory, bytes=written)

    def _record_save(
        self,
        job: _SaveJob,
        manifest_sha: str,
        shard_sha: dict[str, str],
        written: int,
        duration: float,
    ) -> None:
        if self._ledger is not None:
            self._ledger.record_training_event(
                "checkpoint_save",
                {
                    "directory": job.directory,
                    "tag": job.tag,
                    "step": _step_of(job),
                    "manifest_sha256": manifest_sha,
                    "shard_sha256": shard_sha,
                    "bytes": written,
                },
            )
        if self._events is not None:
            from ds.interfaces.telemetry import CheckpointEvent

            self._events.publish(
                CheckpointEvent(
                    "save",
                    job.directory,
                    job.tag,
                    _step_of(job),
                    shard_sha,
                    manifest_sha,
                    written,
                    duration,
                )
            )

    def wait(self) -> None:
        with self._lock:
            job = self._pending
        if job is not None:
            self._finish(job)

    def _at_exit(self) -> None:
        try:
            self.wait()
        except Exception as exc:  # at interpreter exit there is no caller left to raise to
            log.error("asynchronous checkpoint save failed at exit", error=str(exc))

    def write_recovery_script(self, directory: str) -> str:
        """``directory/zero_to_fp32.py`` (ds.interfaces.checkpoint.RecoveryScriptWriter); the
        caller's rank alone writes it (:mod:`ds.checkpoint.recovery_script`)."""
        return recovery_script.write_recovery_script(directory)

    def delete(self, directory: str, tag: str) -> None:
        """Delete checkpoint ``tag`` (never the one ``latest`` names); rank 0 acts, others wait.

        With a mutation boundary this needs an approved ``delete_checkpoint`` intent for the
        checkpoint's path; the deletion is recorded in the ledger.
        """
        self.wait()
        _check_tag(tag)
        directory = os.path.abspath(directory)
        path = os.path.join(directory, tag)

        def delete() -> None:
            if not os.path.isdir(path):
                raise CheckpointError(f"checkpoint {tag!r} not found in {directory}")
            if self.latest_tag(directory) == tag:
                raise CheckpointError(
                    f"checkpoint {tag!r} is the one 'latest' names; save a newer one first"
                )
            if self._boundary is not None:
                self._boundary.require("delete_checkpoint", path)
            doomed = os.path.join(directory, f".del-{tag}")
            os.rename(path, doomed)  # gone for readers at once, even if rmtree is cut short
            fsync_path(directory)
            shutil.rmtree(doomed)
            if self._ledger is not None:
                self._ledger.record_training_event(
                    "checkpoint_delete", {"directory": directory, "tag": tag}
                )
            if self._events is not None:
                from ds.interfaces.telemetry import CheckpointEvent

                self._events.publish(CheckpointEvent("delete", directory, tag, 0))

        self._on_rank0(delete, f"could not delete checkpoint {tag!r}")


def _wait_at_exit(ref: weakref.ref[ShardedCheckpointEngine]) -> None:
    engine = ref()
    if engine is not None:
        engine._at_exit()


def _step_of(job: _SaveJob) -> int:
    return job.step


_check_tag = fmt.check_tag
