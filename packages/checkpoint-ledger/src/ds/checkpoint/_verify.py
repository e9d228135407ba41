"""Reading and verifying a ledger file and its tree heads (what ``ds ledger verify`` runs).

A verification answers one question for whoever runs it: is this file a record-for-record prefix
of what the writer committed to? Its evidence is the hash chain (every record in place, none
altered), the tree heads (Merkle roots over prefixes, signed when a key is configured) and the
heads the verifier brings itself (a checkpoint's, an auditor's copy). What no head covers is only
chained, not committed: anyone who can write the file can append to the chain, so such a tail is
reported as "not covered" and fails whenever a key is pinned or ``strict`` is asked for.

Keys: every signed head of one ledger is signed by one key, unless a ``key_rotation`` record,
signed by the key in effect, hands over to a new one; heads of sizes beyond the rotation record
are then signed by the new key. A pinned key (``public_key``) is the ledger's first key.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from ds.checkpoint import _records, merkle, signing
from ds.interfaces.errors import LedgerError
from ds.interfaces.ledger import TreeHead, VerificationResult

ROTATION_KIND = "key_rotation"


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
        self.rotations: list[tuple[int, dict[str, Any]]] = []  # (index, payload)
        self.exists = True
        self.roots: dict[int, str] = {}  # Merkle root (hex) at each size scan() was asked for
        self.last_leaf: bytes | None = None  # leaf hash of the last good record
        self.sha: Any = None  # SHA-256 (hashlib object) of the good prefix, when asked for


def scan(
    path: str, keep_kinds: bool = False, roots_at: set[int] | None = None, digest: bool = False
) -> LedgerScan:
    """Verify the chain of ``path`` record by record and rebuild its Merkle tree.

    ``roots_at``: sizes (those of tree heads) whose roots are taken as the tree passes them, in
    O(log n) each, so checking every head costs nothing beyond the scan itself. ``digest``: also
    keep a SHA-256 of the good prefix (``LedgerScan.sha``) from the same bytes that were checked.
    """
    out = LedgerScan()
    if roots_at and 0 in roots_at:
        out.roots[0] = merkle.EMPTY_ROOT.hex()
    if digest:
        out.sha = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        out.exists = False
        return out
    scan_bytes(out, data, keep_kinds, roots_at)
    if digest:
        out.sha.update(memoryview(data)[: out.good_bytes])
    return out


def scan_bytes(
    out: LedgerScan, data: bytes, keep_kinds: bool = False, roots_at: set[int] | None = None
) -> None:
    """Continue ``out`` (a scan up to record ``out.records``, byte ``out.good_bytes``) over
    ``data``, the file's bytes from ``out.good_bytes`` on."""
    want = roots_at or set()
    if out.records in want:
        out.roots[out.records] = out.tree.root().hex()
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: b"" for a cleanly ended file
    pos = out.good_bytes
    for line in lines:
        index = out.records
        h, problem, rec = _records.check(line, index, out.last_hash)
        if problem is not None:
            out.first_bad_index = index
            out.reason = f"record {index}: {problem}"
            return
        assert h is not None
        leaf = merkle.leaf_hash(line)
        out.tree.append_leaf_hash(leaf)
        out.last_hash = h
        out.last_leaf = leaf
        out.records += 1
        pos += len(line) + 1
        out.good_bytes = pos
        if out.records in want:
            out.roots[out.records] = out.tree.root().hex()
        kind = rec["kind"]
        if keep_kinds:
            out.kinds.append(str(kind))
        if kind == ROTATION_KIND:
            out.rotations.append((index, rec["payload"]))
    if tail:
        out.torn_tail = tail
        out.first_bad_index = out.records
        out.reason = (
            f"record {out.records}: torn last line ({len(tail)} bytes without a newline; "
            "a crash interrupted its append)"
        )


def read_heads(path: str) -> list[TreeHead]:
    try:
        with open(heads_path(path), "rb") as f:
            return parse_heads(f.read(), heads_path(path))
    except FileNotFoundError:
        return []


def parse_heads(data: bytes, where: str) -> list[TreeHead]:
    """The heads of a ``.heads`` file's bytes (``where`` names it in errors)."""
    heads: list[TreeHead] = []
    for n, line in enumerate(data.split(b"\n")[:-1]):  # a torn last append: the rest stand
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LedgerError(f"{where} line {n + 1} is not a tree head: {exc}") from exc
        heads.append(parse_head(text, f"{where} line {n + 1}"))
    return heads


def parse_head(text: str | dict[str, Any], where: str = "tree head") -> TreeHead:
    """A TreeHead from its JSON (or dict); LedgerError naming ``where`` when it is not one."""
    try:
        obj = json.loads(text) if isinstance(text, str) else text
        if not isinstance(obj, dict):
            raise TypeError(f"expected a JSON object, got {type(obj).__name__}")
        head = TreeHead(**obj)
        if not isinstance(head.size, int) or head.size < 0 or not isinstance(head.root_hash, str):
            raise TypeError("size must be an integer >= 0 and root_hash a hex string")
        float(head.timestamp)
        return head
    except (ValueError, TypeError) as exc:
        raise LedgerError(f"{where} is not a tree head: {exc}") from exc


@dataclass
class KeyChain:
    """The signing key in effect at each ledger size: an initial key and signed hand-overs."""

    initial: str | None
    rotations: list[tuple[int, str]] = field(default_factory=list)  # (record index, new key)

    def key_at(self, size: int) -> str | None:
        key = self.initial
        for index, new in self.rotations:
            if index < size:
                key = new
        return key


def key_chain(
    s: LedgerScan, heads: list[TreeHead], pinned: str | None
) -> tuple[KeyChain, str | None]:
    """The ledger's key chain (from the pin, else its first rotation or signed head), or a problem."""
    signed = sorted((h for h in heads if h.signature is not None), key=lambda h: h.size)
    initial = pinned.lower() if pinned else None
    if initial is None and s.rotations:
        initial = str(s.rotations[0][1].get("old_public_key", "")).lower() or None
    if initial is None and signed:
        initial = (signed[0].public_key or "").lower() or None
    chain = KeyChain(initial)
    current = initial
    for index, p in s.rotations:
        old = str(p.get("old_public_key", "")).lower()
        new = str(p.get("new_public_key", "")).lower()
        if (
            current is None
            or old != current
            or not signing.verify_rotation(index, old, new, str(p.get("signature", "")))
        ):
            return chain, (
                f"record {index}: key rotation is not signed by the key in effect "
                f"({(current or 'none')[:16]}...); forged key hand-over"
            )
        chain.rotations.append((index, new))
        current = new
    return chain, None


def check_head(
    tree: merkle.MerkleTree,
    head: TreeHead,
    public_key: str | None = None,
    *,
    require_signature: bool = False,
) -> str | None:
    """Why ``head`` does not commit to a prefix of ``tree`` (None when it does).

    ``public_key`` is the key that must have signed this head (the one in effect at its size).
    """
    if head.signature is not None and not signing.verify_head_signature(head, public_key):
        if public_key is not None and (head.public_key or "").lower() != public_key.lower():
            return (
                f"tree head for size {head.size} is signed by key {(head.public_key or '')[:16]}..., "
                f"not by the ledger's key {public_key[:16]}... (re-signed by another key)"
            )
        return f"tree head for size {head.size} has an invalid signature (forged or altered)"
    if (public_key is not None or require_signature) and head.signature is None:
        return f"tree head for size {head.size} is unsigned but a signing key is required"
    if head.size > len(tree):
        return (
            f"a tree head commits to {head.size} records but the ledger holds {len(tree)} "
            "(records were removed)"
        )
    if tree.root(head.size).hex() != head.root_hash:
        return f"the first {head.size} records do not match their tree head (history rewritten)"
    return None


def _fail(s: LedgerScan, index: int | None, reason: str) -> VerificationResult:
    return VerificationResult(False, s.records, index, reason)


def verify_file(
    path: str,
    trusted_heads: list[TreeHead] | None = None,
    public_key: str | None = None,
    *,
    strict: bool = False,
    stored_heads: bool = True,
) -> VerificationResult:
    """Full verification: chain, torn tail, keys, every stored and given tree head, coverage.

    ``public_key`` pins the ledger's (first) signing key: heads become mandatory, unsigned or
    otherwise-signed heads fail, and so does any record no signed head covers. ``strict`` asks the
    same of an unpinned ledger (signed heads, full coverage, a ``.heads`` file).
    ``stored_heads=False`` ignores ``.heads`` (evidence whoever can write the file controls) and
    checks the file against ``trusted_heads`` alone: the check of whoever holds the run's final
    head (the last checkpoint's ``ledger_head.json``).
    """
    demanding = strict or public_key is not None
    s = scan(path)
    if not s.exists:
        return _fail(s, 0, f"ledger file {path} does not exist")
    if s.reason is not None:
        return VerificationResult(False, s.records, s.first_bad_index, s.reason)
    stored = read_heads(path) if stored_heads else []
    if demanding and stored_heads and not os.path.exists(heads_path(path)):
        return _fail(
            s,
            0,
            f"{heads_path(path)} is missing: the ledger's signed tree heads were deleted "
            "(or it was never signed)",
        )
    heads = stored + list(trusted_heads or [])
    chain, problem = key_chain(s, heads, public_key)
    if problem is not None:
        return _fail(s, s.rotations[0][0] if s.rotations else 0, problem)
    any_signed = any(h.signature is not None for h in heads)
    covered = 0
    for head in heads:
        key = chain.key_at(head.size) if (any_signed or public_key) else None
        problem = check_head(s.tree, head, key, require_signature=demanding or any_signed)
        if problem is not None:
            bad = s.records if head.size > s.records else max(0, head.size - 1)
            return _fail(s, bad, problem)
        covered = max(covered, head.size)
    signed = bool(heads) and any_signed
    uncovered = s.records - covered
    if demanding and not signed:
        return _fail(s, 0, "no signed tree head: the ledger is not signed")
    if demanding and uncovered:
        return _fail(
            s,
            covered,
            f"{uncovered} records not covered by any signed head (records {covered}.."
            f"{s.records - 1} were appended after the last head and could be forged)",
        )
    return VerificationResult(True, s.records, None, None, signed, uncovered)


def load_trusted_head(spec: str) -> TreeHead:
    """A head from ``--head``: JSON text, or ``@file`` holding one (a manifest's head is accepted)."""
    if spec.startswith("@"):
        name = spec[1:]
        try:
            with open(name, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"head file {name} does not exist") from exc
        return parse_head(text, f"head file {name}")
    return parse_head(spec, "--head value")
