"""Ragged batch: the tokens of many sequences packed end to end, with their cache addresses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RaggedBatch:
    """One forward's input. ``T`` tokens from ``S`` sequences, no padding between them.

    token_ids[T], positions[T] (absolute position in its sequence), token_seq[T] (sequence index),
    slot_mapping[T] (flat cache slot = block * block_size + offset), query_start[S + 1]
    (cumulative query lengths), context_lens[S] (tokens in the cache after this forward),
    block_tables[S, max_blocks] (int32, padded with 0). ``starts`` and ``contexts`` repeat
    query_start and context_lens as host integers: code that loops over the sequences reads
    them there, since reading a device tensor's values would stall the device every forward.

    ``logit_rows`` names the token rows the forward returns logits for; None means each
    sequence's last token. It is set only when some sequence asks for the logits of all its new
    tokens (prompt logprobs), so that plain batches project no more rows than they sample from.
    """

    token_ids: torch.Tensor
    positions: torch.Tensor
    token_seq: torch.Tensor
    slot_mapping: torch.Tensor
    query_start: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    query_lens: tuple[int, ...]
    max_context: int
    starts: tuple[int, ...]
    contexts: tuple[int, ...]
    logit_rows: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def all_decode(self) -> bool:
        return all(q == 1 for q in self.query_lens)


def build_ragged_batch(
    new_tokens: Sequence[Sequence[int]],
    seen: Sequence[int],
    blocks: Sequence[Sequence[int]],
    block_size: int,
    device: torch.device | str = "cpu",
    all_logits: Sequence[bool] | None = None,
) -> RaggedBatch:
    """Pack sequences' new tokens; ``seen[i]`` tokens of sequence i are already cached.

    ``all_logits[i]``: the forward returns logits for every new token of sequence i, not only
    its last (rows in batch order, see :func:`logit_layout`).
    """
    ids: list[int] = []
    pos: list[int] = []
    tseq: list[int] = []
    slots: list[int] = []
    qstart = [0]
    ctx: list[int] = []
    max_blocks = max((len(b) for b in blocks), default=1) or 1
    table = torch.zeros(len(new_tokens), max_blocks, dtype=torch.int32)
    for i, (toks, s, blk) in enumerate(zip(new_tokens, seen, blocks)):
        n = len(toks)
        ids.extend(int(t) for t in toks)
        p = range(s, s + n)
        pos.extend(p)
        tseq.extend([i] * n)
        slots.extend(blk[q // block_size] * block_size + q % block_size for q in p)
        qstart.append(qstart[-1] + n)
        ctx.append(s + n)
        if blk:
            table[i, : len(blk)] = torch.tensor(blk, dtype=torch.int32)

    def t(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long, device=device)

    rows = None
    if all_logits is not None and any(all_logits):
        picked: list[int] = []
        for i, flag in enumerate(all_logits):
            picked.extend(range(qstart[i], qstart[i + 1]) if flag else [qstart[i + 1] - 1])
        rows = t(picked)

    return RaggedBatch(
        token_ids=t(ids),
        positions=t(pos),
        token_seq=t(tseq),
        slot_mapping=t(slots),
        query_start=t(qstart),
        context_lens=t(ctx),
        block_tables=table.to(device),
        query_lens=tuple(len(x) for x in new_tokens),
        max_context=max(ctx, default=0),
        starts=tuple(qstart),
        contexts=tuple(ctx),
        logit_rows=rows,
    )


def logit_layout(query_lens: Sequence[int], all_logits: Sequence[bool]) -> list[tuple[int, int]]:
    """(first, count) of each sequence's rows in the logits a forward with ``logit_rows``
    returns: all its new tokens where flagged, else its last token alone."""
    out = []
    at = 0
    for n, flag in zip(query_lens, all_logits):
        rows = n if flag else 1
        out.append((at, rows))
        at += rows
    return out
