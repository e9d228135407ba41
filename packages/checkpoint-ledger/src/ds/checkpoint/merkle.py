"""RFC 6962 Merkle tree hashing, inclusion and consistency proofs, and their verification.

Leaf hash ``SHA-256(0x00 || leaf)``, interior node ``SHA-256(0x01 || left || right)``, the empty
tree hashes to ``SHA-256("")``. A tree of ``n`` leaves splits at ``k``, the largest power of two
below ``n``. Proof generation follows RFC 6962 section 2.1 (PATH, PROOF/SUBPROOF); verification
follows RFC 9162 section 2.1.3.2 and 2.1.4.2, so a proof made here verifies with any conforming
verifier and vice versa. Verification functions stand alone: they need only hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """Largest power of two strictly smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


class MerkleTree:
    """Append-only tree over leaf hashes; root in O(log n) per append, proofs in O(n)."""

    def __init__(self) -> None:
        self.leaves: list[bytes] = []
        self._stack: list[tuple[int, bytes]] = []  # perfect subtrees, sizes decreasing
        self._cache: dict[tuple[int, int], bytes] = {}

    def __len__(self) -> int:
        return len(self.leaves)

    def append_leaf_hash(self, h: bytes) -> None:
        self.leaves.append(h)
        self._push(h)

    def _push(self, h: bytes) -> None:
        size, node = 1, h
        while self._stack and self._stack[-1][0] == size:
            left_size, left = self._stack.pop()
            node = node_hash(left, node)
            size += left_size
        self._stack.append((size, node))

    def append(self, data: bytes) -> None:
        self.append_leaf_hash(leaf_hash(data))

    def leaf(self, index: int) -> bytes:
        return self.leaves[index]

    def last_leaf(self) -> bytes | None:
        return self.leaves[-1] if self.leaves else None

    def frontier(self) -> list[tuple[int, bytes]]:
        """(size, root) of the perfect subtrees the tree is made of, largest first."""
        return list(self._stack)

    def root(self, size: int | None = None) -> bytes:
        if size is None or size == len(self):
            if not self._stack:
                return EMPTY_ROOT
            node = self._stack[-1][1]
            for _, left in reversed(self._stack[:-1]):
                node = node_hash(left, node)
            return node
        self._check_size(size)
        return self._mth(0, size)

    def _check_size(self, size: int) -> None:
        if size < 0 or size > len(self):
            raise ValueError(f"tree size {size} outside [0, {len(self)}]")

    def _mth(self, lo: int, hi: int) -> bytes:
        n = hi - lo
        if n == 0:
            return EMPTY_ROOT
        if n == 1:
            return self.leaves[lo]
        perfect = n & (n - 1) == 0
        if perfect and (lo, hi) in self._cache:
            return self._cache[(lo, hi)]
        k = _split(n)
        h = node_hash(self._mth(lo, lo + k), self._mth(lo + k, hi))
        if perfect:  # complete subtrees never change as the log grows
            self._cache[(lo, hi)] = h
        return h

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        size = len(self.leaves) if size is None else size
        self._check_size(size)
        if not 0 <= index < size:
            raise ValueError(f"leaf index {index} outside a tree of {size} leaves")
        return self._path(index, 0, size)

    def _path(self, m: int, lo: int, hi: int) -> list[bytes]:
        n = hi - lo
        if n == 1:
            return []
        k = _split(n)
        if m < k:
            return [*self._path(m, lo, lo + k), self._mth(lo + k, hi)]
        return [*self._path(m - k, lo + k, hi), self._mth(lo, lo + k)]

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> list[bytes]:
        new_size = len(self.leaves) if new_size is None else new_size
        self._check_size(new_size)
        if not 0 <= old_size <= new_size:
            raise ValueError(f"old size {old_size} must be within [0, new size {new_size}]")
        if old_size == 0 or old_size == new_size:
            return []
        return self._subproof(old_size, 0, new_size, True)

    def _subproof(self, m: int, lo: int, hi: int, complete: bool) -> list[bytes]:
        n = hi - lo
        if m == n:
            return [] if complete else [self._mth(lo, hi)]
        k = _split(n)
        if m <= k:
            return [*self._subproof(m, lo, lo + k, complete), self._mth(lo + k, hi)]
        return [*self._subproof(m - k, lo + k, hi, False), self._mth(lo, lo + k)]


def _to_right_child(fn: int, sn: int) -> tuple[int, int]:
    # RFC 9162 (2.1.3.2, 2.1.4.2): after hashing a left sibling, climb both node numbers until
    # ``fn`` is a right child (its lowest bit set) or the root (0).
    while not fn & 1 and fn != 0:
        fn, sn = fn >> 1, sn >> 1
    return fn, sn


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> bool:
    """True when ``leaf`` (a leaf *hash*) is at ``index`` of the tree of ``size`` with ``root``."""
    if not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            fn, sn = _to_right_child(fn, sn)
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """True when the tree of ``old_size``/``old_root`` is a prefix of ``new_size``/``new_root``."""
    if old_size < 0 or old_size > new_size:
        return False
    if old_size == new_size:
        return not proof and old_root == new_root
    if old_size == 0:
        return not proof and old_root == EMPTY_ROOT
    path = list(proof)
    if old_size & (old_size - 1) == 0:  # exact power of two: the old root is a node of the proof
        path.insert(0, old_root)
    if not path:
        return False
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            fn, sn = _to_right_child(fn, sn)
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return fr == old_root and sr == new_root and sn == 0
