"""What the writer checks before it continues an existing ledger (every open of a non-empty file).

A writer that continues a ledger signs heads over everything in it, so it must first be sure that
everything in it is its own: every record is covered by a head it signed (by the key in effect at
that size) or by its seal (``_seal``), every head agrees with the file, no head or record it once
vouched for has gone. Otherwise it stops with :class:`LedgerBreakError`, one line naming what is
wrong; ``ds ledger recover PATH`` then keeps the files as evidence and starts a new signed segment
whose first record describes the break. Operator mistakes (a different key, no key) are plain
:class:`LedgerError`.

The check costs what the writer's scan of the file costs anyway: head roots are taken during the
scan (``scan(roots_at=...)``), signatures are checked once per head, the seal is two small slots.
A keyed writer's scan resumes from its sealed state (``_resume``): the records and heads that
state vouches for are not re-read, only the file prefix's digest is compared.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

from ds.checkpoint import _seal, signing
from ds.checkpoint._verify import LedgerScan, heads_path, key_chain
from ds.interfaces.errors import LedgerError
from ds.interfaces.ledger import TreeHead


class LedgerBreakError(LedgerError):
    """The ledger file disagrees with its own evidence (heads, seal): tampered or damaged.

    Uncaught, the process exits 3 (not 1) so that a scheduler can
    stop resubmitting a run whose history needs a person."""

    exit_code = 3


def recover_hint(path: str) -> str:
    return (
        f"keep the files as evidence and run `ds ledger recover {path}` with the run's signing "
        "key to start a new signed segment that records the break"
    )


@dataclass
class Reopened:
    initial_public: str | None  # the ledger's first key (None: unsigned)
    seal: _seal.SealEntry | None  # the newest valid seal
    adopt: bool  # records beyond the last signed head, vouched for by the seal: sign them now
    uncovered: int  # unsigned ledger: records no head covers (reported, not refused)


def check(path: str, s: LedgerScan, heads: list[TreeHead], key: Any, vouched: int = 0) -> Reopened:
    """Refuse (raise) unless the writer holding ``key`` may continue ``path`` as scanned in ``s``.

    ``vouched``: how many leading heads the writer's sealed state (``_resume``) vouches for,
    together with the records below them; ``s`` then resumed from that state.
    """
    mine = signing.public_hex(key) if key is not None else None
    seals, sealed = _seal.read(path, signing.seal_key(key)) if key is not None else ([], False)

    def brk(what: str) -> LedgerBreakError:
        return LedgerBreakError(f"ledger {path}: {what}; {recover_hint(path)}")

    for e in seals:
        if e.index > s.records or (e.index == s.records and e is not seals[0]):
            raise brk(
                f"the writer's seal ({_seal.seal_path(path)}) vouches for record {e.index} but "
                f"the file holds {s.records} records (records were removed)"
            )
    signed = [h for h in heads if h.signature is not None]
    if not signed and not s.rotations:
        return _check_unsigned(path, s, heads, mine, seals, brk)
    if mine is None:
        raise LedgerError(
            f"ledger {path} has signed tree heads but no signing key is configured; open it with "
            f"the run's key (ledger.signing_key or ${signing.ENV_KEY})"
        )
    chain, problem = key_chain(s, heads, None)
    if problem is not None:
        raise brk(problem)
    current = chain.key_at(s.records)
    if current != mine:
        if seals:  # this key wrote the file: someone else signed its heads
            raise brk(
                f"its tree heads are signed by key {(current or '')[:16]}..., not by this "
                f"writer's key {mine[:16]}... (heads re-signed)"
            )
        raise LedgerError(
            f"ledger {path} is signed by key {(current or '')[:16]}... and this process has key "
            f"{mine[:16]}...; open it with that key (ledger.signing_key or ${signing.ENV_KEY}) or "
            "hand over with rotate_key() while it is open with the old one; if that key is the "
            f"run's own, its heads were re-signed: {recover_hint(path)}"
        )
    sealed_heads = _sealed_heads(path, seals, brk)
    for k, h in enumerate(heads[vouched:], vouched):  # in the sealed prefix: roots only
        _check_head(h, chain.key_at(h.size) if k >= sealed_heads else None, s, brk)
    covered = max(h.size for h in signed) if signed else 0
    if seals and max(e.head for e in seals) > covered:
        raise brk(
            f"the writer's seal records a signed head of size {max(e.head for e in seals)} but "
            f"{heads_path(path)} goes up to {covered} (signed heads were removed)"
        )
    adopt = False
    if s.records > covered:
        last = s.last_leaf.hex() if s.last_leaf is not None else ""
        if not any(e.index == s.records - 1 and e.leaf == last for e in seals):
            why = "no writer's seal vouches for them" if not sealed else "not sealed by this writer"
            raise brk(
                f"records {covered}..{s.records - 1} are not covered by a signed tree head and "
                f"{why} (appended by someone else, or history rewritten)"
            )
        adopt = True
    return Reopened(chain.initial, seals[0] if seals else None, adopt, 0)


def _sealed_heads(path: str, seals: list[_seal.SealEntry], brk: Any) -> int:
    """How many leading heads of ``.heads`` are exactly as the writer sealed them."""
    if not seals:
        return 0
    e = seals[0]
    try:
        with open(heads_path(path), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        data = b""
    if len(data) < e.heads_len or hashlib.sha256(data[: e.heads_len]).hexdigest() != e.heads_sha:
        raise brk(
            f"the first {e.heads_len} bytes of {heads_path(path)} are not the heads the writer "
            "sealed (heads altered or removed)"
        )
    return data[: e.heads_len].count(b"\n")


def _check_unsigned(
    path: str,
    s: LedgerScan,
    heads: list[TreeHead],
    mine: str | None,
    seals: list[_seal.SealEntry],
    brk: Any,
) -> Reopened:
    if mine is not None and s.records:
        if seals:
            raise brk(
                f"{heads_path(path)} holds no signed tree head, but this writer sealed the "
                "ledger with its key (signed heads were deleted or replaced)"
            )
        if not os.path.exists(heads_path(path)):
            raise brk(
                f"it holds {s.records} records but no {heads_path(path)} (a keyed ledger has "
                "heads from its first moment, so they were deleted)"
            )
        if heads:
            raise LedgerError(
                f"ledger {path} was written with unsigned tree heads; a signing key cannot be "
                "added to it midway (its earlier heads would be unsigned): start a new ledger "
                "for signed records"
            )
    for h in heads:
        _check_head(h, None, s, brk)
    covered = max((h.size for h in heads), default=0)
    return Reopened(mine, seals[0] if seals else None, False, s.records - covered)


def _check_head(h: TreeHead, key: str | None, s: LedgerScan, brk: Any) -> None:
    if key is not None and not signing.verify_head_signature(h, key):
        raise brk(
            f"its tree head of size {h.size} is not signed by the key in effect "
            f"({key[:16]}...): forged, altered or re-signed"
        )
    if h.size > s.records:
        raise brk(
            f"a tree head commits to {h.size} records but the file holds {s.records} "
            "(records were removed)"
        )
    if s.roots.get(h.size) != h.root_hash:
        raise brk(f"the first {h.size} records do not match their tree head (history rewritten)")
