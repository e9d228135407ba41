"""The writer's seal: which record it wrote last, and the largest head it signed, MAC'd with its key.

A signed tree head commits to a prefix of the ledger, but heads are signed only now and then (at
checkpoint commits, verification and close), so after a crash the records written since the last
head are covered by nothing a verifier could check, and look exactly like records someone else
appended. The seal lets the writer tell them apart when it reopens the file: before every append
it writes ``(n, index, leaf, head, heads_len, heads_sha)``: the record's index and Merkle leaf
hash, the size of its last signed head and the length and SHA-256 of ``.heads`` as it wrote it,
with a MAC (keyed BLAKE2b) under a key derived from the signing key
(:func:`ds.checkpoint.signing.seal_key`), into ``<ledger>.seal``. The leaf hash covers the
record's chain link, so a seal of the last record vouches for every record before it; the digest
of ``.heads`` vouches for every head the writer appended, so reopening checks their signatures only
beyond that prefix (one SHA-256 over the file instead of an Ed25519 verification per head).

The file has two fixed-size slots written alternately (``n`` is a sequence number, slot ``n % 2``),
so a write torn by a crash spoils at most the newer slot and the older one still stands. The seal
is written *before* its record: a crash between the two leaves a seal one record ahead of the file
(the record was never acknowledged), never a record without its seal.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import mmap
import os
from dataclasses import dataclass

SLOT = 384  # bytes per slot: one JSON object (below 300 bytes) padded with spaces


def seal_path(path: str) -> str:
    return path + ".seal"


@dataclass(frozen=True)
class SealEntry:
    n: int  # sequence number of the seal write
    index: int  # the record it vouches for (its leaf hash is ``leaf``); -1: no record yet
    leaf: str
    head: int  # size of the largest head the writer had signed
    heads_len: int  # bytes of .heads the writer had written ...
    heads_sha: str  # ... and their SHA-256


def _mac(key: bytes, n: int, index: int, leaf: str, head: int, heads_len: int, sha: str) -> str:
    # Keyed BLAKE2b: a MAC in one pass, cheap enough to run before every append.
    msg = f"{n}|{index}|{leaf}|{head}|{heads_len}|{sha}".encode()
    return hashlib.blake2b(msg, key=key, digest_size=32).hexdigest()


def read(path: str, key: bytes) -> tuple[list[SealEntry], bool]:
    """The slots of ``path``'s seal whose MAC holds under ``key``, newest first; and whether the
    seal file exists."""
    try:
        with open(seal_path(path), "rb") as f:
            data = f.read(2 * SLOT)
    except FileNotFoundError:
        return [], False
    good: list[SealEntry] = []
    for k in range(2):
        try:
            obj = json.loads(data[k * SLOT : (k + 1) * SLOT])
            e = SealEntry(
                int(obj["n"]),
                int(obj["i"]),
                str(obj["leaf"]),
                int(obj["head"]),
                int(obj["heads_len"]),
                str(obj["heads_sha"]),
            )
            mac = _mac(key, e.n, e.index, e.leaf, e.head, e.heads_len, e.heads_sha)
            ok = hmac.compare_digest(str(obj["mac"]), mac)
        except (ValueError, KeyError, TypeError):
            continue  # a torn or foreign slot vouches for nothing
        if ok and e.n % 2 == k:
            good.append(e)
    return sorted(good, key=lambda e: e.n, reverse=True), True


class SealWriter:
    """Writes the seal of one ledger (the writer's, under the ledger's lock)."""

    def __init__(self, path: str, key: bytes, last: SealEntry | None) -> None:
        self._key = key
        self._fd = os.open(seal_path(path), os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size < 2 * SLOT:
            os.ftruncate(self._fd, 2 * SLOT)
        # Shared memory map: a slot write is a copy into the page cache, no system call, and
        # like a write() it survives the process being killed.
        self._map = mmap.mmap(self._fd, 2 * SLOT)
        self._n = last.n if last is not None else -1
        self.head = last.head if last is not None else 0
        self._heads_len = 0
        self._heads_sha = hashlib.sha256()
        try:
            with open(path + ".heads", "rb") as f:
                data = f.read()
            self._heads_len, self._heads_sha = len(data), hashlib.sha256(data)
        except FileNotFoundError:
            pass
        self._heads_hex = self._heads_sha.hexdigest()

    @property
    def heads_len(self) -> int:
        return self._heads_len

    @property
    def heads_sha(self) -> str:
        return self._heads_hex

    def rekey(self, key: bytes) -> None:
        self._key = key

    def head_written(self, text: bytes, index: int, leaf: str, size: int) -> None:
        """The writer appended ``text`` (a head of ``size`` records) to ``.heads``."""
        self._heads_len += len(text)
        self._heads_sha.update(text)
        self._heads_hex = self._heads_sha.hexdigest()
        self.write(index, leaf, head=size)

    def write(self, index: int, leaf: str, head: int | None = None) -> None:
        """Seal record ``index`` (leaf hash ``leaf``): on the append path, so kept lean."""
        if head is not None:
            self.head = max(self.head, head)
        self._n += 1
        n, h, hl, sha = self._n, self.head, self._heads_len, self._heads_hex
        mac = _mac(self._key, n, index, leaf, h, hl, sha)
        line = (
            f'{{"head":{h},"heads_len":{hl},"heads_sha":"{sha}","i":{index},"leaf":"{leaf}",'
            f'"mac":"{mac}","n":{n}}}'
        ).encode()
        at = (n % 2) * SLOT
        self._map[at : at + SLOT] = line.ljust(SLOT - 1) + b"\n"

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)
