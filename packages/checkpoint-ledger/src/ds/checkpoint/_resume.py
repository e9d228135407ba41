"""The writer's sealed state: where a keyed writer's reopen resumes instead of re-reading records.

Rebuilding the hash chain and the Merkle tree record by record (parse, re-encode and hash every
JSON line) is what made reopening a long ledger slow. So whenever a keyed writer signs a head it
also writes ``<ledger>.state``: the number of records and the byte offset they end at, the
SHA-256 of the file's bytes up to that offset (kept as a running hash of exactly the bytes it
wrote or verified, never re-read), the chain head (last record hash), the last leaf hash, the
Merkle frontier (the roots of the perfect subtrees, at most log2(n) of them), the key rotations so
far, and the length and SHA-256 of ``.heads`` as it wrote them; MAC'd (keyed BLAKE2b) under the
seal key (:func:`ds.checkpoint.signing.seal_key`), so only a holder of the signing key can make or
check one.

A reopen with a valid state streams the file prefix through SHA-256 (disk speed, no JSON) and
compares it with the sealed digest: equal bytes are the bytes the writer held, so their chain and
tree are the ones it sealed and the heads in the sealed ``.heads`` prefix commit to them. It then
restores the tree from the frontier and checks only what came after (records parsed and chained
as always, heads checked for signature and root) through the same :mod:`ds.checkpoint._reopen`
check as a full scan. Anything that does not fit (no state or a bad MAC, a short file, a prefix
whose digest differs, a ``.heads`` prefix that differs, a later head below the sealed size) falls
back to the full scan, which names the problem; so a record rewritten anywhere in the sealed prefix,
whatever the tail looks like, is caught exactly as before. An older state replayed by the attacker
only moves the point from which records are re-checked.

The restored tree knows its frontier, not its leaves: a proof over the sealed prefix
(``prove_inclusion``, ``root_hash(size)``, ...) reads them all from the file on first need, and one
leaf (``leaf_hash``, ``vouches``) is hashed from its line; both only after checking the prefix
against the sealed digest again, so a file changed since the open is refused then.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import mmap
import os
from dataclasses import asdict, dataclass
from typing import Any

from ds.checkpoint import _records, merkle
from ds.checkpoint._reopen import LedgerBreakError, recover_hint
from ds.checkpoint._verify import LedgerScan, heads_path, parse_heads, scan_bytes
from ds.interfaces.ledger import TreeHead

_DOMAIN = b"ds-ledger-state-v1\n"


def state_path(path: str) -> str:
    return path + ".state"


@dataclass(frozen=True)
class State:
    records: int
    offset: int  # bytes of the file the records take
    sha: str  # SHA-256 of those bytes
    chain: str  # hash of the last record (the chain head)
    last_leaf: str  # its Merkle leaf hash ("" for none)
    frontier: list[list[Any]]  # [size, root hex] of the perfect subtrees, largest first
    rotations: list[list[Any]]  # [index, payload] of every key_rotation record
    heads_len: int  # bytes of .heads the writer had written ...
    heads_sha: str  # ... and their SHA-256


def _mac(key: bytes, body: bytes) -> str:
    return hashlib.blake2b(_DOMAIN + body, key=key, digest_size=32).hexdigest()


def write(path: str, key: bytes, st: State) -> None:
    """Replace ``path``'s state (by its one writer, under the ledger's lock, so one temporary name
    serves and a crash leaves nothing the next write does not replace). Not fsynced: a state lost
    or torn by a power cut fails its MAC or its digest, and the next reopen takes the full scan."""
    body = _records.canonical(asdict(st)).encode()
    tmp = state_path(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(body + b"\n" + _mac(key, body).encode() + b"\n")
    os.replace(tmp, state_path(path))


def read(path: str, key: bytes) -> State | None:
    """``path``'s state if its MAC holds under ``key``, else None."""
    try:
        with open(state_path(path), "rb") as f:
            body, mac, *_ = f.read().split(b"\n") + [b""]
        if not hmac.compare_digest(mac, _mac(key, body).encode()):
            return None
        return State(**json.loads(body))
    except (OSError, ValueError, TypeError):
        return None


def capture(tree: merkle.MerkleTree, prev: str, size: int, sha: Any, **rest: Any) -> State:
    """The state of a writer holding ``tree`` over ``size`` bytes hashed into ``sha``."""
    last = tree.last_leaf()
    return State(
        records=len(tree),
        offset=size,
        sha=sha.hexdigest(),
        chain=prev,
        last_leaf=last.hex() if last is not None else "",
        frontier=[[n, h.hex()] for n, h in tree.frontier()],
        **rest,
    )


def open_scan(path: str, key: bytes) -> tuple[LedgerScan, list[TreeHead], int] | None:
    """The writer's scan of ``path`` resumed from its sealed state, the heads, and how many
    leading heads the state vouches for; None when the state does not apply (full scan then)."""
    st = read(path, key)
    if st is None:
        return None
    try:
        with open(heads_path(path), "rb") as f:
            hdata = f.read()
        sha, tail = _prefix_digest(path, st.offset)
    except (FileNotFoundError, ValueError):  # no file, or shorter than the sealed prefix
        return None
    if len(hdata) < st.heads_len or sha.hexdigest() != st.sha:
        return None
    if hashlib.sha256(hdata[: st.heads_len]).hexdigest() != st.heads_sha:
        return None
    heads = parse_heads(hdata, heads_path(path))
    vouched = hdata[: st.heads_len].count(b"\n")
    later = heads[vouched:]
    if any(h.size < st.records for h in later):
        return None  # a head inside the sealed prefix the writer did not write: full check
    s = LedgerScan()
    s.tree = ResumedTree(path, st)
    s.last_hash, s.records, s.good_bytes = st.chain, st.records, st.offset
    s.last_leaf = bytes.fromhex(st.last_leaf) if st.last_leaf else None
    s.rotations = [(int(i), dict(p)) for i, p in st.rotations]
    scan_bytes(s, tail, roots_at={h.size for h in later})
    sha.update(memoryview(tail)[: s.good_bytes - st.offset])
    s.sha = sha
    return s, heads, vouched


def _prefix_digest(path: str, offset: int) -> tuple[Any, bytes]:
    """SHA-256 of ``path``'s first ``offset`` bytes (hashed from a read-only map of the file, no
    copy) and the bytes after them; ValueError when the file is shorter."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < offset:
            raise ValueError(f"{path} holds {size} bytes, fewer than {offset}")
        if size == 0:
            return hashlib.sha256(), b""
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m, memoryview(m) as view:
            sha = hashlib.sha256(view[:offset])
            return sha, bytes(view[offset:])


class ResumedTree(merkle.MerkleTree):
    """A tree restored from a sealed frontier; the sealed prefix's leaves are read on first need."""

    def __init__(self, path: str, st: State) -> None:
        self._stack = [(int(n), bytes.fromhex(h)) for n, h in st.frontier]
        self._cache: dict[tuple[int, int], bytes] = {}
        self._file, self._st = path, st
        self._last = bytes.fromhex(st.last_leaf) if st.last_leaf else None
        self._more: list[bytes] = []  # leaves appended since, while the prefix is not loaded
        self._all: list[bytes] | None = None

    def __len__(self) -> int:
        return len(self._all) if self._all is not None else self._st.records + len(self._more)

    @property
    def leaves(self) -> list[bytes]:  # type: ignore[override]  # read-only: loaded on demand
        if self._all is None:
            self._all = self._load() + self._more
            self._more = []
        return self._all

    def append_leaf_hash(self, h: bytes) -> None:
        (self._more if self._all is None else self._all).append(h)
        self._last = h
        self._push(h)

    def last_leaf(self) -> bytes | None:
        return self._last

    def leaf(self, index: int) -> bytes:
        """One leaf without loading them all: a leaf of the sealed prefix is the hash of its line
        in the prefix, once the prefix has its sealed digest (one SHA-256 pass)."""
        if self._all is not None or not 0 <= index < self._st.records:
            return self.leaves[index]
        return merkle.leaf_hash(self._prefix().split(b"\n", index + 1)[index])

    def _prefix(self) -> bytes:
        st = self._st
        with open(self._file, "rb") as f:
            data = f.read(st.offset)
        if hashlib.sha256(data).hexdigest() != st.sha:  # a short read differs too
            raise LedgerBreakError(
                f"ledger {self._file}: its first {st.offset} bytes changed after this writer "
                f"opened it (history rewritten); {recover_hint(self._file)}"
            )
        return data

    def _load(self) -> list[bytes]:
        sha256 = hashlib.sha256  # merkle.leaf_hash, inlined: this runs once per record
        return [sha256(b"\x00" + line).digest() for line in self._prefix().split(b"\n")[:-1]]
