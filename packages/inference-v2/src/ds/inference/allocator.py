"""Block allocator of the KV cache: free list, reference counts, prefix table with LRU eviction.

A block is in exactly one of three states:

* free: on the free list, content meaningless;
* used: referenced by one or more sequences (``refcount > 0``);
* cached: unreferenced but registered in the prefix table, kept in LRU order so a later request
  with the same prefix can reuse it; allocation evicts the least recently used cached block only
  when the free list is empty.
"""

from __future__ import annotations

from collections import OrderedDict

from ds.interfaces.errors import InferenceError

# A prefix key identifies the full token content of a sequence up to and including one block.
PrefixKey = bytes


class BlockAllocator:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise InferenceError(f"the KV cache needs at least one block (got {num_blocks})")
        self.num_blocks = num_blocks
        # Pop from the end: low block ids are handed out first, which keeps tests readable.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._refcount = [0] * num_blocks
        self._key_of: dict[int, PrefixKey] = {}
        self._block_of: dict[PrefixKey, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached (refcount 0) blocks

    # -- queries ------------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        """Blocks an allocation can obtain now (free plus evictable cached blocks)."""
        return len(self._free) + len(self._lru)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks

    @property
    def cached_blocks(self) -> int:
        return len(self._lru)

    def refcount(self, block: int) -> int:
        return self._refcount[block]

    # -- allocation ---------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """``n`` blocks with refcount 1; all or nothing."""
        if n > self.free_blocks:
            raise InferenceError(
                f"KV cache exhausted: {n} blocks requested, {self.free_blocks} free of "
                f"{self.num_blocks}; flush finished sequences or enlarge kv_cache.num_blocks"
            )
        out: list[int] = []
        for _ in range(n):
            if self._free:
                block = self._free.pop()
            else:
                block, _ = self._lru.popitem(last=False)
                del self._block_of[self._key_of.pop(block)]
            self._refcount[block] = 1
            out.append(block)
        return out

    def incref(self, block: int) -> None:
        if self._refcount[block] == 0:
            if block not in self._lru:
                raise InferenceError(
                    f"block {block} is free; only used or cached blocks can be shared"
                )
            del self._lru[block]
        self._refcount[block] += 1

    def release(self, blocks: list[int]) -> None:
        """Drop one reference of each block; unreferenced blocks become cached or free."""
        for block in blocks:
            count = self._refcount[block]
            if count <= 0:
                raise InferenceError(f"block {block} released more often than it was referenced")
            self._refcount[block] = count - 1
            if count == 1:
                if block in self._key_of:
                    self._lru[block] = None
                else:
                    self._free.append(block)

    # -- prefix table -------------------------------------------------------------------------
    def lookup(self, key: PrefixKey) -> int | None:
        return self._block_of.get(key)

    def register(self, block: int, key: PrefixKey) -> None:
        """Publish a full, used block under its prefix key (first writer wins)."""
        if key in self._block_of or block in self._key_of:
            return
        self._block_of[key] = block
        self._key_of[block] = key

    def check_invariants(self) -> None:
        """Every block is in exactly one state; used for property tests."""
        free = set(self._free)
        assert len(free) == len(self._free), "duplicate block on the free list"
        cached = set(self._lru)
        for block in range(self.num_blocks):
            states = (block in free) + (block in cached) + (self._refcount[block] > 0)
            assert states == 1, f"block {block} is in {states} states"
            if block in cached:
                assert block in self._key_of
        assert len(self._key_of) == len(self._block_of)
