"""The ledger's record encoding: canonical, hash-linked JSON lines.

A record is ``{"i", "kind", "payload", "prev", "rank", "t"}``; its ``hash`` is the SHA-256 of the
canonical JSON of that object (sorted keys, no spaces, ASCII). The stored line is
``{"hash":"<hash>",`` followed by the canonical body after its opening brace, so the line is itself
canonical and every byte of it is covered by the hash or is the hash. ``prev`` is the previous
record's hash (64 zeros for the first), which makes the log a hash chain; the whole line is also a
Merkle leaf.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

GENESIS = "0" * 64


def _default(obj: Any) -> Any:
    # Tensors, paths, enums, dataclasses: recorded by their readable form.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=_default)
_encode_str = json.encoder.encode_basestring_ascii


def canonical(obj: Any) -> str:
    return _ENCODER.encode(obj)


def encode(
    index: int, t: float, kind: str, rank: int, payload: Mapping[str, Any], prev: str
) -> tuple[bytes, str]:
    # The append hot path: the outer keys are formatted directly, in sorted order, exactly as
    # canonical() would (ints and finite floats by repr, strings ASCII-escaped); only the
    # payload goes through the encoder. check() re-derives the body with canonical().
    body = (
        f'{{"i":{int(index)},"kind":{_encode_str(kind)},"payload":{_ENCODER.encode(payload)},'
        f'"prev":{_encode_str(prev)},"rank":{int(rank)},"t":{float(t)!r}}}'
    )
    h = hashlib.sha256(body.encode()).hexdigest()
    return f'{{"hash":"{h}",{body[1:]}'.encode(), h


def check(line: bytes, index: int, prev: str) -> tuple[str | None, str | None, dict[str, Any]]:
    """(hash, problem, record) of one stored line expected at ``index`` after ``prev``."""
    try:
        rec = json.loads(line)
    except ValueError as exc:
        return None, f"not valid JSON ({exc})", {}
    if not isinstance(rec, dict) or set(rec) != {
        "hash",
        "i",
        "kind",
        "payload",
        "prev",
        "rank",
        "t",
    }:
        return None, "not a ledger record (unexpected fields)", {}
    h = rec.pop("hash")
    body = canonical(rec)
    if hashlib.sha256(body.encode()).hexdigest() != h:
        return None, "content does not match its hash (record altered)", rec
    if f'{{"hash":"{h}",{body[1:]}'.encode() != line:
        return None, "record is not in canonical form (bytes altered)", rec
    if rec["i"] != index:
        return (
            None,
            f"record says index {rec['i']}, found at {index} (records deleted, inserted or reordered)",
            rec,
        )
    if rec["prev"] != prev:
        return None, "previous-hash link broken (records deleted, inserted or reordered)", rec
    return str(h), None, rec
