"""Sequence state manager: which sequences exist, how many tokens each has seen, their KV blocks."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from ds.inference.allocator import BlockAllocator, PrefixKey
from ds.inference.config import StateManagerConfig
from ds.interfaces.errors import InferenceError

_ROOT: PrefixKey = b"ds-prefix-root"


def chain_key(parent: PrefixKey, block_tokens: Sequence[int]) -> PrefixKey:
    """Content key of a full block: its tokens chained with the key of everything before it."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(b"".join(int(t).to_bytes(8, "little", signed=True) for t in block_tokens))
    return h.digest()


@dataclass
class SequenceState:
    uid: int
    tokens: list[int] = field(default_factory=list)  # every token whose KV is in the cache
    blocks: list[int] = field(default_factory=list)
    keys: list[PrefixKey] = field(default_factory=list)  # prefix keys of the leading full blocks

    @property
    def seen_tokens(self) -> int:
        return len(self.tokens)


class StateManager:
    def __init__(
        self,
        config: StateManagerConfig,
        allocator: BlockAllocator,
        block_size: int,
        prefix_caching: bool = False,
    ) -> None:
        self.config = config
        self.allocator = allocator
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._seqs: dict[int, SequenceState] = {}

    # -- lookup -------------------------------------------------------------------------------
    def get(self, uid: int) -> SequenceState | None:
        return self._seqs.get(uid)

    def __contains__(self, uid: int) -> bool:
        return uid in self._seqs

    @property
    def active_sequences(self) -> int:
        return len(self._seqs)

    def uids(self) -> list[int]:
        return list(self._seqs)

    def blocks_needed(self, seen: int, held: int, new_tokens: int) -> int:
        total = -(-(seen + new_tokens) // self.block_size)
        return max(0, total - held)

    # -- mutation -----------------------------------------------------------------------------
    def get_or_create(self, uid: int) -> SequenceState:
        seq = self._seqs.get(uid)
        if seq is None:
            if len(self._seqs) >= self.config.max_tracked_sequences:
                raise InferenceError(
                    f"cannot track sequence {uid}: {len(self._seqs)} sequences are live, the limit "
                    "is state_manager.max_tracked_sequences; flush finished sequences first"
                )
            seq = SequenceState(uid)
            self._seqs[uid] = seq
        return seq

    def reserve(self, seq: SequenceState, new_tokens: int) -> None:
        """Make room for ``new_tokens`` more tokens of ``seq`` (all-or-nothing)."""
        total = seq.seen_tokens + new_tokens
        if total > self.config.max_context:
            raise InferenceError(
                f"sequence {seq.uid} would hold {total} tokens, more than "
                f"state_manager.max_context={self.config.max_context}; raise max_context"
            )
        need = self.blocks_needed(seq.seen_tokens, len(seq.blocks), new_tokens)
        if need:
            seq.blocks.extend(self.allocator.allocate(need))

    def commit(self, seq: SequenceState, new_tokens: Sequence[int]) -> None:
        """Record tokens whose KV was written; publish newly full blocks to the prefix table."""
        seq.tokens.extend(int(t) for t in new_tokens)
        if not self.prefix_caching:
            return
        full = seq.seen_tokens // self.block_size
        bs = self.block_size
        while len(seq.keys) < full:
            i = len(seq.keys)
            parent = seq.keys[-1] if seq.keys else _ROOT
            key = chain_key(parent, seq.tokens[i * bs : (i + 1) * bs])
            self.allocator.register(seq.blocks[i], key)
            seq.keys.append(key)

    def match_prefix(self, uid: int, prompt: Sequence[int]) -> int:
        """Attach cached blocks holding a prefix of ``prompt`` to a new sequence ``uid``.

        Leaves at least one prompt token uncached so the next forward produces logits. Returns
        the number of prompt tokens already in the cache (a multiple of the block size).
        """
        if not self.prefix_caching:
            return 0
        seq = self.get_or_create(uid)
        if seq.seen_tokens:
            return 0
        bs = self.block_size
        parent = _ROOT
        matched: list[tuple[int, PrefixKey]] = []
        for i in range((len(prompt) - 1) // bs):
            key = chain_key(parent, prompt[i * bs : (i + 1) * bs])
            block = self.allocator.lookup(key)
            if block is None:
                break
            matched.append((block, key))
            parent = key
        for block, key in matched:
            self.allocator.incref(block)
            seq.blocks.append(block)
            seq.keys.append(key)
        seq.tokens.extend(int(t) for t in prompt[: len(matched) * bs])
        return len(matched) * bs

    def share_prefix(self, src: int, dst: int, prompt: Sequence[int]) -> int:
        """Attach to new sequence ``dst`` the full blocks of ``src`` that hold a prefix of
        ``prompt`` (reference counted, never copied: full blocks are not written again).

        Used for ``n > 1`` siblings of one prompt; works with prefix caching off. Leaves at least
        one prompt token to compute, for its logits. Returns the tokens attached.
        """
        source = self._seqs.get(src)
        if source is None:
            return 0
        bs = self.block_size
        limit = min(len(prompt) - 1, source.seen_tokens) // bs
        n = 0
        while n < limit and source.tokens[n * bs : (n + 1) * bs] == list(
            prompt[n * bs : (n + 1) * bs]
        ):
            n += 1
        if n == 0:
            return 0
        seq = self.get_or_create(dst)
        if seq.seen_tokens:
            return 0
        for block in source.blocks[:n]:
            self.allocator.incref(block)
        seq.blocks.extend(source.blocks[:n])
        seq.keys.extend(source.keys[:n])
        seq.tokens.extend(int(t) for t in prompt[: n * bs])
        return n * bs

    def flush(self, uid: int) -> None:
        seq = self._seqs.pop(uid, None)
        if seq is None:
            raise InferenceError(f"cannot flush unknown sequence {uid}")
        self.allocator.release(seq.blocks)
