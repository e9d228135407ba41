"""RunLedger: an append-only, hash-chained, Merkle-committed run ledger.

Every event (training steps, checkpoint saves with their SHA-256 digests, loads, configuration and
environment changes, intents and approvals) becomes one canonical JSON line (see ``_records``),
linked to its predecessor by hash and added as a leaf of an RFC 6962 Merkle tree (``merkle``).
Tree heads (size, root, time) are signed with Ed25519 when a key is configured and appended to a
``<ledger>.heads`` file: at every checkpoint commit, at ``verify_ledger_integrity`` and at
``close``; the last checkpoint carries the latest one. Anyone holding a head can check that a
record is in the log (inclusion proof) and that a later log extends it (consistency proof).

Appends are exclusive (an advisory lock on ``<ledger>.lock``) and all-or-nothing: a record that
could not be written completely is cut off again before the error is raised, so indices stay
dense. In a multi-rank job rank 0 owns the file; the other ranks send their events to it over an
authenticated socket (``_ledger_net``), so there is exactly one writer.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from ds.checkpoint import _records, _reopen, _resume, _seal, merkle, signing
from ds.checkpoint._fsutil import atomic_write_bytes
from ds.checkpoint._lockfile import WriterLock
from ds.checkpoint._reopen import LedgerBreakError
from ds.checkpoint._verify import (  # re-exported: the ledger's reading side
    ROTATION_KIND,
    LedgerScan,
    check_head,
    heads_path,
    read_heads,
    scan,
    verify_file,
)
from ds.interfaces.errors import LedgerError
from ds.interfaces.ledger import TreeHead, VerificationResult
from ds.interfaces.logging import get_logger

log = get_logger(__name__)

__all__ = [
    "LedgerBreakError",
    "LedgerScan",
    "RunLedger",
    "TechnicalDueDiligenceLedger",
    "check_head",
    "heads_path",
    "read_heads",
    "scan",
    "verify_file",
]


class RunLedger:
    """The default :class:`ds.interfaces.ledger.Ledger`.

    ``path``: the JSON-lines file (created if absent). ``signing_key``: Ed25519 key spec (see
    :mod:`ds.checkpoint.signing`), else ``$DS_LEDGER_SIGNING_KEY``, else heads are unsigned; a
    ledger keeps the key it was started with unless :meth:`rotate_key` hands over to another.
    ``comm``: Communicator of a multi-rank job (rank 0 writes, others send). ``fsync``: fsync after
    every record (power-loss durable, slower); by default each record is handed to the OS at once
    (process-crash durable). ``recover_torn_tail``: on open, move a torn last line aside into
    ``<path>.torn-<offset>`` and record that it happened, instead of refusing to open.
    """

    def __init__(
        self,
        path: str,
        *,
        signing_key: Any = None,
        comm: Any | None = None,
        fsync: bool = False,
        recover_torn_tail: bool = False,
        rank: int | None = None,
    ) -> None:
        self.path = os.path.abspath(path)
        self._key = signing.load_private_key(signing_key) if signing_key else signing.key_from_env()
        self._fsync = fsync
        self._lock = threading.Lock()
        self._rank = rank if rank is not None else (0 if comm is None else int(comm.get_rank()))
        self._comm = comm
        self._client: Any = None
        self._server: Any = None
        self._fd: int | None = None
        self._writer_lock: WriterLock | None = None
        self._seal: _seal.SealWriter | None = None
        self._sha: Any = None  # keyed: SHA-256 of the file as written, for the sealed state
        self._rotations: list[list[Any]] = []
        self._head_size = 0  # size of the last head this writer signed
        self._broken: str | None = None
        self._head_sink: str | None = None
        self._initial_public: str | None = None
        self._closed = False
        world = 1 if comm is None else int(comm.get_world_size())
        if comm is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            log.warning(
                "ledger opened without a communicator in a multi-rank job: every rank would "
                "write the file; pass comm= so rank 0 is the only writer",
                path=self.path,
            )
        if world == 1:
            if self._rank == 0:
                self._open(recover_torn_tail)
            return
        from ds.checkpoint import _ledger_net

        assert comm is not None
        box: list[Any] = [None]
        if self._rank == 0:
            try:
                self._open(recover_torn_tail)
                self._server = _ledger_net.LedgerServer(self)
                box = [{"address": self._server.address, "secret": self._server.secret}]
            except Exception as exc:  # every rank must hear it, or the others wait forever
                box = [{"error": f"{type(exc).__name__}: {exc}"}]
                comm.broadcast_object_list(box, src=0)
                self.close_local()
                raise
        # The job's own process group carries the writer's address and the job secret: only a
        # member of the rendezvous learns the secret, and the writer refuses anyone without it.
        comm.broadcast_object_list(box, src=0)
        info = box[0]
        if self._rank != 0:
            if "error" in info:
                raise LedgerError(f"rank 0 could not open ledger {self.path}: {info['error']}")
            self._client = _ledger_net.LedgerClient(info["address"], self._rank, info["secret"])

    @property
    def signed(self) -> bool:
        return self._key is not None

    # ------------------------------------------------------------------ writer side
    def _open(self, recover: bool) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._writer_lock = WriterLock(self.path)  # before reading: nobody appends meanwhile
        try:
            self._open_locked(recover)
        except BaseException:
            self.close_local()
            raise

    def _open_locked(self, recover: bool) -> None:
        mac_key = signing.seal_key(self._key) if self._key is not None else None
        try:
            # Keyed: resume from the sealed state (the records it covers are not re-read).
            fast = _resume.open_scan(self.path, mac_key) if mac_key is not None else None
            heads = read_heads(self.path) if fast is None else fast[1]
        except LedgerError as exc:  # a .heads line that is not a head: altered evidence
            raise LedgerBreakError(f"{exc}; {_reopen.recover_hint(self.path)}") from exc
        if fast is None:
            s = scan(self.path, roots_at={h.size for h in heads}, digest=mac_key is not None)
        else:
            s = fast[0]
        torn: bytes | None = None
        if s.reason is not None:
            if s.torn_tail is None or not recover:
                hint = (
                    "open with recover_torn_tail=True (ledger.recover_torn_tail) to move the torn "
                    "bytes aside and record that"
                    if s.torn_tail is not None
                    else _reopen.recover_hint(self.path)
                )
                err = LedgerError if s.torn_tail is not None else _reopen.LedgerBreakError
                raise err(f"cannot append to ledger {self.path}: {s.reason}; {hint}")
            torn = s.torn_tail
        vouched = fast[2] if fast is not None else 0
        state = _reopen.check(self.path, s, heads, self._key, vouched)  # before any change
        if torn is not None:
            aside = f"{self.path}.torn-{s.good_bytes}"
            with open(aside, "wb") as f:
                f.write(torn)
                f.flush()
                os.fsync(f.fileno())
            with open(self.path, "r+b") as f:
                f.truncate(s.good_bytes)
                os.fsync(f.fileno())
        self._initial_public = state.initial_public
        if state.uncovered:
            log.warning(
                "unsigned ledger reopened with records no tree head covers (a crash, or appended "
                "by anyone who can write the file; configure a signing key to tell them apart)",
                path=self.path,
                uncovered=state.uncovered,
            )
        if self._key is not None:
            self._seal = _seal.SealWriter(self.path, signing.seal_key(self._key), state.seal)
        self._tree = s.tree
        self._sha = s.sha
        self._rotations = [[i, p] for i, p in s.rotations]
        self._prev = s.last_hash
        self._size = s.good_bytes
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if (s.records == 0 and not os.path.exists(heads_path(self.path))) or state.adopt:
            # A new ledger has heads from the start (their absence is evidence); a tail the
            # writer's seal vouched for is committed by a signed head before anything else.
            self.tree_head()
        if torn is not None:
            import hashlib

            log.warning("ledger had a torn last line; moved aside", path=self.path, bytes=len(torn))
            self.record_training_event(
                "torn_tail_recovered",
                {
                    "bytes": len(torn),
                    "sha256": hashlib.sha256(torn).hexdigest(),
                    "moved_to": f"{self.path}.torn-{s.good_bytes}",
                },
            )

    def record_training_event(self, kind: str, payload: Mapping[str, Any]) -> int:
        """Append one event; returns its index (its leaf position in the Merkle tree)."""
        if self._client is not None:
            return int(self._client.call("record", kind=kind, payload=dict(payload)))
        return self._append(kind, payload, self._rank)

    def _append(self, kind: str, payload: Mapping[str, Any], rank: int) -> int:
        with self._lock:
            return self._append_locked(kind, payload, rank)

    def _append_locked(self, kind: str, payload: Mapping[str, Any], rank: int) -> int:
        fd = self._fd
        if fd is None:
            raise LedgerError(f"ledger {self.path} is closed; open a new RunLedger")
        if self._broken is not None:
            raise LedgerError(f"ledger {self.path} refuses appends: {self._broken}")
        index = len(self._tree)
        line, h = _records.encode(index, time.time(), kind, rank, payload, self._prev)
        data = line + b"\n"
        leaf = merkle.leaf_hash(line)
        if self._seal is not None:  # sealed before written: no record of ours is ever unsealed
            self._seal.write(index, leaf.hex())
        try:
            # One unbuffered write: nothing of a failed record lingers in a buffer to be
            # flushed later behind the error (a buffered file would retry it on the next write).
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(f"short write ({written} of {len(data)} bytes; disk full?)")
            if self._fsync:
                os.fsync(fd)
        except OSError as exc:
            self._cut_back()
            raise LedgerError(
                f"could not append record {index} ({kind}) to ledger {self.path}: {exc}; "
                "nothing of it was kept"
            ) from exc
        self._size += len(data)
        if self._sha is not None:
            self._sha.update(data)
        self._tree.append_leaf_hash(leaf)
        self._prev = h
        return index

    def _cut_back(self) -> None:
        """After a failed append, truncate the file to the last complete record."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, self._size)
        except OSError as exc:  # the next open sees the partial line as a torn tail
            self._broken = (
                f"a failed append could not be cut back ({exc}); reopen with recover_torn_tail=True"
            )

    def attach(self, bus: Any, *, steps: bool = True) -> None:
        """Record the engine's telemetry: every StepMetrics (when ``steps``) and ConfigEvent.

        Checkpoint saves and loads are recorded by the checkpoint engine itself (with digests).
        """
        from ds.interfaces.telemetry import ConfigEvent, StepMetrics

        if steps:
            bus.subscribe(lambda m: self.record_training_event("step", asdict(m)), StepMetrics)
        bus.subscribe(
            lambda e: self.record_training_event("config", {"config": e.config, "env": e.env}),
            ConfigEvent,
        )

    def rotate_key(self, new_key: Any) -> int:
        """Hand signing over to ``new_key``: a ``key_rotation`` record signed by the current key.

        Heads after the record are signed by the new key; verifiers follow the hand-over from the
        ledger's first key. Returns the record's index.
        """
        if self._client is not None:
            raise LedgerError("rotate_key() is a writer operation; call it on rank 0")
        new = signing.load_private_key(new_key)
        if new is None or self._key is None:
            raise LedgerError("rotate_key() needs a current signing key and a new one")
        new_public = signing.public_hex(new)
        with self._lock:
            index = len(self._tree)
            payload = {
                "old_public_key": signing.public_hex(self._key),
                "new_public_key": new_public,
                "signature": signing.sign_rotation(self._key, index, new_public),
            }
            self._append_locked(ROTATION_KIND, payload, self._rank)
            self._rotations.append([index, payload])
            self._key = new
            if self._seal is not None:
                self._seal.rekey(signing.seal_key(new))
        self.tree_head()
        return index

    # ------------------------------------------------------------------ commitments
    def __len__(self) -> int:
        if self._client is not None:
            return int(self._client.call("size"))
        return len(self._tree)

    def set_head_sink(self, path: str | None) -> None:
        """Also write every later head to ``path`` (atomically): the last checkpoint's copy."""
        if self._client is not None:
            return  # heads are written by rank 0, which has its own sink
        with self._lock:
            self._head_sink = path

    def tree_head(self) -> TreeHead:
        """Sign (when keyed) and publish the head of the log as it stands; returns it."""
        if self._client is not None:
            return TreeHead(**self._client.call("head"))
        with self._lock:
            size = len(self._tree)
            root = self._tree.root().hex()
            head = signing.sign_head(self._key, size, root, time.time())
            if self._fd is not None and not self._fsync:
                # A signed head is evidence: the records it commits to reach the disk first.
                os.fsync(self._fd)
            text = json.dumps(asdict(head), sort_keys=True) + "\n"
            with open(heads_path(self.path), "a", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())  # heads are rare and are the evidence against truncation
            self._head_size = size
            if self._seal is not None and head.signature is not None:
                leaf = self._tree.last_leaf()
                self._seal.head_written(text.encode(), size - 1, leaf.hex() if leaf else "", size)
                self._write_state()
            sink = self._head_sink
        if sink is not None:
            try:
                atomic_write_bytes(sink, text.encode())
            except OSError as exc:  # the checkpoint was deleted or moved: the head still stands
                log.warning("could not copy the ledger head", path=sink, error=str(exc))
        return head

    def _write_state(self) -> None:
        """Seal where the next reopen may resume (``_resume``); under the lock, after a head."""
        assert self._seal is not None and self._key is not None
        st = _resume.capture(
            self._tree,
            self._prev,
            self._size,
            self._sha,
            rotations=self._rotations,
            heads_len=self._seal.heads_len,
            heads_sha=self._seal.heads_sha,
        )
        try:
            _resume.write(self.path, signing.seal_key(self._key), st)
        except OSError as exc:  # only the next reopen's speed depends on it
            log.warning("could not write the ledger state", path=self.path, error=str(exc))

    def prove_inclusion(self, index: int, tree_size: int | None = None) -> list[str]:
        if self._client is not None:
            return list(self._client.call("prove_inclusion", index=index, tree_size=tree_size))
        with self._lock:
            try:
                return [h.hex() for h in self._tree.inclusion_proof(index, tree_size)]
            except ValueError as exc:
                raise LedgerError(f"cannot prove inclusion: {exc}") from exc

    def prove_consistency(self, old_size: int, new_size: int | None = None) -> list[str]:
        if self._client is not None:
            return list(
                self._client.call("prove_consistency", old_size=old_size, new_size=new_size)
            )
        with self._lock:
            try:
                return [h.hex() for h in self._tree.consistency_proof(old_size, new_size)]
            except ValueError as exc:
                raise LedgerError(f"cannot prove consistency: {exc}") from exc

    def leaf_hash(self, index: int) -> str:
        if self._client is not None:
            return str(self._client.call("leaf_hash", index=index))
        with self._lock:
            return self._tree.leaf(index).hex()

    def root_hash(self, size: int | None = None) -> str:
        if self._client is not None:
            return str(self._client.call("root_hash", size=size))
        with self._lock:
            return self._tree.root(size).hex()

    def vouches(self, index: int, line: bytes) -> bool:
        """Whether ``line`` is record ``index`` as this writer holds it, committed by a signed
        head (one is signed now if none covers it yet). The writer's own view: what it wrote,
        and what it verified when it opened the file, never what the file says now."""
        if self._client is not None:
            raise LedgerError("vouches() is a writer operation; call it on rank 0")
        with self._lock:
            if not 0 <= index < len(self._tree):
                return False
            if self._tree.leaf(index) != merkle.leaf_hash(line):
                return False
            covered = index < self._head_size
        if self._key is not None and not covered:
            self.tree_head()
        return True

    def verify_ledger_integrity(self) -> VerificationResult:
        """Sign a head over everything so far, then re-read the file from disk and verify it.

        A keyed ledger is verified strictly against its own first key: ``.heads`` must exist,
        every head must be signed by the key in effect and cover the file.
        """
        if self._client is not None:
            return VerificationResult(**self._client.call("verify"))
        if self._fd is not None:
            self.tree_head()
        if self._key is None and self._initial_public is None:
            return verify_file(self.path)
        return verify_file(self.path, public_key=self._initial_public, strict=True)

    def close(self) -> None:
        """Collective in a multi-rank job; the writer signs a final head, then closes the file."""
        if self._comm is not None and int(self._comm.get_world_size()) > 1 and not self._closed:
            # Every rank's events were acknowledged before this barrier: rank 0 may then stop.
            self._comm.barrier()
        self._closed = True
        self._end("_client", "close")
        self._end("_server", "stop")
        if self._fd is not None and self._broken is None:
            self.tree_head()  # the final head: truncating any suffix is now detectable
        self.close_local()

    def close_local(self) -> None:
        with self._lock:
            if self._fd is not None:
                try:
                    os.fsync(self._fd)
                finally:
                    os.close(self._fd)
                    self._fd = None
            self._end("_seal", "close")
            self._end("_writer_lock", "release")

    def _end(self, attr: str, method: str) -> None:
        # The network ends, the seal and the writer lock are each ended once, by the first close.
        held = getattr(self, attr)
        if held is not None:
            getattr(held, method)()
            setattr(self, attr, None)

    def __enter__(self) -> RunLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The seed name of the run ledger, kept as an alias of the public API.
TechnicalDueDiligenceLedger = RunLedger
