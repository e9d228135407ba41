"""RFC 6962 tree hashes, inclusion and consistency proofs against a direct recursive definition."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from ds.checkpoint.merkle import (
    EMPTY_ROOT,
    MerkleTree,
    leaf_hash,
    node_hash,
    verify_consistency,
    verify_inclusion,
)


def _mth(leaves: list[bytes]) -> bytes:
    # RFC 6962 section 2.1, written as literally as possible.
    n = len(leaves)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1
    while k * 2 < n:
        k *= 2
    return hashlib.sha256(b"\x01" + _mth(leaves[:k]) + _mth(leaves[k:])).digest()


def _tree(n: int) -> tuple[MerkleTree, list[bytes]]:
    data = [f"leaf-{i}".encode() for i in range(n)]
    t = MerkleTree()
    for d in data:
        t.append(d)
    return t, data


def test_known_vectors() -> None:
    assert EMPTY_ROOT.hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert (
        leaf_hash(b"").hex() == "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"
    )
    assert (
        node_hash(b"a" * 32, b"b" * 32) == hashlib.sha256(b"\x01" + b"a" * 32 + b"b" * 32).digest()
    )


def test_roots_match_definition_for_every_size() -> None:
    t, data = _tree(40)
    for n in range(41):
        assert t.root(n) == _mth(data[:n])
    assert t.root() == _mth(data)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 70), st.data())
def test_inclusion_proofs_verify_and_reject_wrong_leaves(n: int, data: st.DataObject) -> None:
    t, _ = _tree(n)
    m = data.draw(st.integers(0, n - 1))
    size = data.draw(st.integers(m + 1, n))
    proof = t.inclusion_proof(m, size)
    assert verify_inclusion(t.leaves[m], m, size, proof, t.root(size))
    assert not verify_inclusion(leaf_hash(b"other"), m, size, proof, t.root(size))
    if size > 1:
        assert not verify_inclusion(t.leaves[m], (m + 1) % size, size, proof, t.root(size))
        assert not verify_inclusion(t.leaves[m], m, size, proof[:-1], t.root(size))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 70), st.data())
def test_consistency_between_any_two_sizes(n: int, data: st.DataObject) -> None:
    t, _ = _tree(n)
    old = data.draw(st.integers(0, n))
    new = data.draw(st.integers(old, n))
    proof = t.consistency_proof(old, new)
    assert verify_consistency(old, new, t.root(old), t.root(new), proof)
    if 0 < old < new:
        assert not verify_consistency(old, new, t.root(old), leaf_hash(b"x"), proof)
        assert not verify_consistency(old, new, leaf_hash(b"x"), t.root(new), proof)


def test_consistency_fails_for_a_fork() -> None:
    t, data = _tree(20)
    fork = MerkleTree()
    for d in data[:9] + [b"forged"]:
        fork.append(d)
    for old in range(10, 11):
        for new in range(old, 21):
            proof = t.consistency_proof(old, new)
            assert not verify_consistency(old, new, fork.root(old), t.root(new), proof)
