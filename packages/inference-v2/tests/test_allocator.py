"""Block allocator and state manager properties (hypothesis) and direct unit checks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ds.inference.allocator import BlockAllocator
from ds.inference.config import StateManagerConfig
from ds.inference.state import StateManager
from ds.interfaces.errors import InferenceError

BS = 4
NUM_BLOCKS = 12

# An operation: ("put", uid, tokens) or ("flush", uid). Tokens come from a 3-symbol alphabet
# so that prompts share prefixes often.
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("put"), st.integers(0, 4), st.lists(st.integers(0, 2), min_size=1, max_size=14)
        ),
        st.tuples(st.just("flush"), st.integers(0, 4)),
    ),
    max_size=40,
)


def _state(prefix: bool) -> StateManager:
    cfg = StateManagerConfig(max_tracked_sequences=8, max_context=64)
    return StateManager(cfg, BlockAllocator(NUM_BLOCKS), BS, prefix_caching=prefix)


def _put(sm: StateManager, uid: int, tokens: list[int]) -> None:
    """What the engine does around a forward: check room, reserve, commit."""
    seq = sm.get(uid)
    if seq is None:
        sm.get_or_create(uid)
        hit = sm.match_prefix(uid, tokens)
        tokens = tokens[hit:]
        seq = sm.get(uid)
    assert seq is not None
    sm.reserve(seq, len(tokens))
    sm.commit(seq, tokens)


@settings(max_examples=150, deadline=None)
@given(ops, st.booleans())
def test_no_leaks_and_clean_refusals(operations: list[tuple], prefix: bool) -> None:
    sm = _state(prefix)
    alloc = sm.allocator
    for op in operations:
        if op[0] == "put":
            _, uid, tokens = op
            seq = sm.get(uid)
            before = (alloc.free_blocks, list(seq.blocks) if seq else None)
            try:
                _put(sm, uid, tokens)
            except InferenceError:
                # Refused cleanly: the sequence kept its blocks, nothing else was allocated
                # (a brand-new sequence may hold prefix blocks it matched, which flush frees).
                seq = sm.get(uid)
                if before[1] is not None:
                    assert seq is not None and seq.blocks == before[1]
                    assert alloc.free_blocks == before[0]
        elif sm.get(op[1]) is not None:
            sm.flush(op[1])
        alloc.check_invariants()
        held = [b for uid in sm.uids() for b in sm.get(uid).blocks]  # type: ignore[union-attr]
        for b in set(held):
            assert alloc.refcount(b) == held.count(b)
        assert alloc.used_blocks == len(set(held))
    for uid in sm.uids():
        sm.flush(uid)
    alloc.check_invariants()
    assert alloc.free_blocks == NUM_BLOCKS
    assert alloc.used_blocks == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=2 * BS + 1, max_size=3 * BS), st.integers(2, 4))
def test_shared_prefix_blocks_freed_only_by_last_user(prompt: list[int], users: int) -> None:
    sm = _state(prefix=True)
    alloc = sm.allocator
    _put(sm, 0, prompt)
    shared = sm.get(0).blocks[: (len(prompt) - 1) // BS]  # type: ignore[union-attr]
    for uid in range(1, users):
        _put(sm, uid, prompt)
        assert sm.get(uid).blocks[: len(shared)] == shared  # type: ignore[union-attr]
    for uid in range(users):
        for b in shared:
            assert alloc.refcount(b) == users - uid
        sm.flush(uid)
    for b in shared:
        assert alloc.refcount(b) == 0
    # Unreferenced full blocks stay cached for reuse (one copy per content) but count as free.
    assert alloc.free_blocks == NUM_BLOCKS
    assert alloc.cached_blocks == len(prompt) // BS


def test_over_budget_refused_with_actionable_message() -> None:
    sm = _state(prefix=False)
    seq = sm.get_or_create(0)
    with pytest.raises(InferenceError, match=r"KV cache exhausted.*num_blocks"):
        sm.reserve(seq, NUM_BLOCKS * BS + 1)
    assert sm.allocator.free_blocks == NUM_BLOCKS and seq.blocks == []
    with pytest.raises(InferenceError, match="max_context"):
        sm.reserve(seq, 65)


def test_lru_eviction_prefers_oldest_cached_block() -> None:
    alloc = BlockAllocator(3)
    a, b, c = alloc.allocate(3)
    alloc.register(a, b"ka")
    alloc.register(b, b"kb")
    alloc.release([a])
    alloc.release([b])
    alloc.release([c])  # unregistered: straight to the free list
    assert alloc.allocate(1) == [c]
    assert alloc.allocate(1) == [a]  # a was cached first, so it is evicted first
    assert alloc.lookup(b"ka") is None and alloc.lookup(b"kb") == b
    alloc.incref(b)  # a later user revives the cached block
    assert alloc.refcount(b) == 1 and alloc.free_blocks == 0
    with pytest.raises(InferenceError, match="exhausted"):
        alloc.allocate(1)
    alloc.check_invariants()
