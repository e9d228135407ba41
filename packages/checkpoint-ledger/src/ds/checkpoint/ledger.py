"""TechnicalDueDiligenceLedger: an append-only, hash-chained, Merkle-committed run ledger.

Every event (training steps, checkpoint saves with their SHA-256 digests, loads, configuration and
environment changes, intents and approvals) becomes one canonical JSON line (see ``_records``),
linked to its predecessor by hash and added as a leaf of an RFC 6962 Merkle tree (``merkle``).
Tree heads (size, root, time) are signed with Ed25519 when a key is configured and appended to a
``<ledger>.heads`` file; checkpoint manifests embed them. Anyone holding a head can check that a
record is in the log (inclusion proof) and that a later log extends it (consistency proof).

In a multi-rank job rank 0 owns the file; the other ranks send their events to it over a socket
(``_ledger_net``), so there is exactly one writer.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from ds.checkpoint import _records, merkle, signing
from ds.interfaces.errors import LedgerError
from ds.interfaces.ledger import TreeHead, VerificationResult
from ds.interfaces.logging import get_logger

log = get_logger(__name__)


def heads_path(path: str) -> str:
    return path + ".heads"


class LedgerScan:
    """Result of reading a ledger file: the good prefix, and the first problem if any."""

    def __init__(self) -> None:
        self.tree = merkle.MerkleTree()
        self.last_hash = _records.GENESIS
        self.records = 0
        self.good_bytes = 0  # length of the verified prefix of the file
        self.first_bad_index: int | None = None
        self.reason: str | None = None
        self.torn_tail: bytes | None = None
        self.kinds: list[str] = []


def scan(path: str, keep_kinds: bool = False) -> LedgerScan:
    """Verify the chain of ``path`` record by record and rebuild its Merkle tree."""
    out = LedgerScan()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return out
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: b"" for a cleanly ended file
    pos = 0
    for index, line in enumerate(lines):
        h, problem, rec = _records.check(line, index, out.last_hash)
        if problem is not None:
            out.first_bad_index = index
            out.reason = f"record {index}: {problem}"
            return out
        assert h is not None
        out.tree.append(line)
        out.last_hash = h
        out.records += 1
        pos += len(line) + 1
        out.good_bytes = pos
        if keep_kinds:
            out.kinds.append(str(rec["kind"]))
    if tail:
        out.torn_tail = tail
        out.first_bad_index = len(lines)
        out.reason = (
            f"record {len(lines)}: torn last line ({len(tail)} bytes without a newline; "
            "a crash interrupted its append)"
        )
    return out


def read_heads(path: str) -> list[TreeHead]:
    heads: list[TreeHead] = []
    try:
        with open(heads_path(path), encoding="utf-8") as f:
            for n, line in enumerate(f):
                if not line.endswith("\n"):
                    break  # torn head append: the previous heads still stand
                try:
                    heads.append(TreeHead(**json.loads(line)))
                except (ValueError, TypeError) as exc:
                    raise LedgerError(
                        f"{heads_path(path)} line {n + 1} is not a tree head: {exc}"
                    ) from exc
    except FileNotFoundError:
        pass
    return heads


def check_head(
    tree: merkle.MerkleTree, head: TreeHead, public_key: str | None = None
) -> str | None:
    """Why ``head`` does not commit to a prefix of ``tree`` (None when it does)."""
    if head.signature is not None and not signing.verify_head_signature(head, public_key):
        return f"tree head for size {head.size} has an invalid signature (forged or altered)"
    if public_key is not None and head.signature is None:
        return f"tree head for size {head.size} is unsigned but a signing key is required"
    if head.size > len(tree):
        return (
            f"a tree head commits to {head.size} records but the ledger holds {len(tree)} "
            "(records were removed)"
        )
    if tree.root(head.size).hex() != head.root_hash:
        return f"the first {head.size} records do not match their tree head (history rewritten)"
    return None


def verify_file(
    path: str,
    trusted_heads: list[TreeHead] | None = None,
    public_key: str | None = None,
) -> VerificationResult:
    """Full verification: chain, torn tail, and every stored and given tree head."""
    s = scan(path)
    if s.reason is not None:
        return VerificationResult(False, s.records, s.first_bad_index, s.reason)
    heads = read_heads(path) + list(trusted_heads or [])
    for head in heads:
        problem = check_head(s.tree, head, public_key)
        if problem is not None:
            bad = s.records if head.size > s.records else max(0, head.size - 1)
            return VerificationResult(False, s.records, bad, problem)
    signed = bool(heads) and all(h.signature is not None for h in heads)
    return VerificationResult(True, s.records, None, None, signed)


class TechnicalDueDiligenceLedger:
    """The default :class:`ds.interfaces.ledger.Ledger`.

    ``path``: the JSON-lines file (created if absent). ``signing_key``: Ed25519 key spec (see
    :mod:`ds.checkpoint.signing`), else ``$DS_LEDGER_SIGNING_KEY``, else heads are unsigned.
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
        self._file: Any = None
        world = 1 if comm is None else int(comm.get_world_size())
        if comm is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            log.warning(
                "ledger opened without a communicator in a multi-rank job: every rank would "
                "write the file; pass comm= so rank 0 is the only writer",
                path=self.path,
            )
        if self._rank == 0:
            self._open(recover_torn_tail)
        if world > 1:
            from ds.checkpoint import _ledger_net

            assert comm is not None
            addr: Any = None
            if self._rank == 0:
                self._server = _ledger_net.LedgerServer(self)
                addr = self._server.address
            box = [addr]
            comm.broadcast_object_list(box, src=0)
            if self._rank != 0:
                self._client = _ledger_net.LedgerClient(box[0], self._rank)

    @property
    def signed(self) -> bool:
        return self._key is not None

    # ------------------------------------------------------------------ writer side
    def _open(self, recover: bool) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        s = scan(self.path)
        torn: bytes | None = None
        if s.reason is not None:
            if s.torn_tail is None or not recover:
                hint = (
                    "open with recover_torn_tail=True (ledger.recover_torn_tail) to move the torn "
                    "bytes aside and record that"
                    if s.torn_tail is not None
                    else "the ledger is damaged or tampered with; keep it as evidence and start a new one"
                )
                raise LedgerError(f"cannot append to ledger {self.path}: {s.reason}; {hint}")
            torn = s.torn_tail
            aside = f"{self.path}.torn-{s.good_bytes}"
            with open(aside, "wb") as f:
                f.write(torn)
                f.flush()
                os.fsync(f.fileno())
            with open(self.path, "r+b") as f:
                f.truncate(s.good_bytes)
                os.fsync(f.fileno())
        self._tree = s.tree
        self._prev = s.last_hash
        self._file = open(self.path, "ab")  # noqa: SIM115 - lives as long as the ledger
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
        if self._file is None:
            raise LedgerError(
                f"ledger {self.path} is closed; open a new TechnicalDueDiligenceLedger"
            )
        with self._lock:
            index = len(self._tree)
            line, h = _records.encode(index, time.time(), kind, rank, payload, self._prev)
            self._file.write(line + b"\n")
            self._file.flush()
            if self._fsync:
                os.fsync(self._file.fileno())
            self._tree.append(line)
            self._prev = h
            return index

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

    # ------------------------------------------------------------------ commitments
    def __len__(self) -> int:
        if self._client is not None:
            return int(self._client.call("size"))
        return len(self._tree)

    def tree_head(self) -> TreeHead:
        """Sign (when keyed) and publish the head of the log as it stands; returns it."""
        if self._client is not None:
            return TreeHead(**self._client.call("head"))
        with self._lock:
            size = len(self._tree)
            root = self._tree.root().hex()
            head = signing.sign_head(self._key, size, root, time.time())
            if self._file is not None:  # a closed ledger still answers heads and proofs
                self._file.flush()  # the head never commits to records the OS has not got
            with open(heads_path(self.path), "a", encoding="utf-8") as f:
                f.write(json.dumps(asdict(head), sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())  # heads are rare and are the evidence against truncation
            return head

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
            return self._tree.leaves[index].hex()

    def root_hash(self, size: int | None = None) -> str:
        if self._client is not None:
            return str(self._client.call("root_hash", size=size))
        with self._lock:
            return self._tree.root(size).hex()

    def verify_ledger_integrity(self) -> VerificationResult:
        """Re-read the file from disk and verify chain, Merkle heads and signatures."""
        if self._client is not None:
            return VerificationResult(**self._client.call("verify"))
        with self._lock:
            if self._file is not None:
                self._file.flush()
        public = signing.public_hex(self._key) if self._key is not None else None
        return verify_file(self.path, public_key=public)

    def close(self) -> None:
        if self._comm is not None and int(self._comm.get_world_size()) > 1:
            # Every rank's events were acknowledged before this barrier: rank 0 may then stop.
            self._comm.barrier()
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._file is not None:
            with self._lock:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
                self._file = None

    def __enter__(self) -> TechnicalDueDiligenceLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
