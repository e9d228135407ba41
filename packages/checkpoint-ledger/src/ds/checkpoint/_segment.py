"""``ds ledger recover``: after the writer refused a ledger, keep it as evidence and start a new
signed segment whose first record describes the break.

The refused files (``<ledger>``, ``.heads``, ``.seal``, ``.state``) are renamed to
``<ledger>.broken-<n>`` (``.heads``/``.seal``/``.state`` alike), untouched, and a new ledger at
the same path begins with a ``ledger_break`` record: the evidence file's name, size and SHA-256,
how many of its records a signed head covered, its last signed head and the writer's refusal. The new segment is signed by
the run's key (a keyed ledger is never continued unsigned), so nothing in it vouches for the old
file; the old file's checkpoints are verified against the evidence file.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict
from typing import Any

from ds.checkpoint import _resume, _seal, signing
from ds.checkpoint._lockfile import WriterLock
from ds.checkpoint._reopen import LedgerBreakError
from ds.checkpoint._verify import heads_path, read_heads, scan
from ds.interfaces.errors import LedgerError

BREAK_KIND = "ledger_break"


def _evidence_name(path: str) -> str:
    n = 1
    while os.path.exists(f"{path}.broken-{n}"):
        n += 1
    return f"{path}.broken-{n}"


def recover(path: str, signing_key: Any = None) -> str | None:
    """Start a new segment at ``path`` if its writer refuses it; returns the evidence file's
    name, or None when the ledger opens cleanly (nothing is changed then)."""
    from ds.checkpoint.ledger import RunLedger

    key = signing.load_private_key(signing_key) if signing_key else signing.key_from_env()
    try:
        RunLedger(path, signing_key=key).close()
        return None
    except LedgerBreakError as exc:
        problem = str(exc)
    if key is None and any(h.signature is not None for h in _heads_or_empty(path)):
        raise LedgerError(
            f"ledger {path} was signed: the new segment needs the run's signing key "
            f"(--signing-key or ${signing.ENV_KEY})"
        )
    lock = WriterLock(path)
    try:
        evidence = _evidence_name(path)
        info = _describe(path)
        for src, dst in (
            (heads_path(path), heads_path(evidence)),
            (_seal.seal_path(path), _seal.seal_path(evidence)),
            (_resume.state_path(path), _resume.state_path(evidence)),
            (path, evidence),
        ):
            if os.path.exists(src):
                os.rename(src, dst)
    finally:
        lock.release()
    with RunLedger(path, signing_key=key) as led:
        led.record_training_event(BREAK_KIND, {"previous": evidence, **info, "problem": problem})
    return evidence


def _heads_or_empty(path: str) -> list[Any]:
    try:
        return read_heads(path)
    except LedgerError:
        return []


def _describe(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        data = f.read()
    s = scan(path)
    signed = sorted(
        (h for h in _heads_or_empty(path) if h.signature is not None), key=lambda h: h.size
    )
    return {
        "previous_bytes": len(data),
        "previous_sha256": hashlib.sha256(data).hexdigest(),
        "previous_records": s.records,
        "previous_last_signed_head": asdict(signed[-1]) if signed else None,
    }
