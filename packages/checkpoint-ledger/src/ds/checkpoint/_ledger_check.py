"""A checkpoint and its run ledger vouch for each other (``ds checkpoint verify --ledger``).

A committed checkpoint carries two tree heads of the run ledger: ``manifest.json``'s
``ledger_head`` (taken just before the manifest was written) and ``ledger_head.json`` beside it,
rewritten by the ledger at every later head while this is the run's last checkpoint, so it ends as
the run's final head (``close()``). Whoever holds a copy of the checkpoint can therefore detect a
ledger that was shortened, rewritten or re-signed after the save. The ledger in turn holds a
``checkpoint_save`` (or ``checkpoint_recovered``) record with the manifest's and every file's
SHA-256.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from ds.interfaces.errors import LedgerError
from ds.interfaces.ledger import TreeHead

HEAD_FILE = "ledger_head.json"
SAVE_KINDS = ("checkpoint_save", "checkpoint_recovered")
RECOVERED = (
    "ledger record {i} is a checkpoint_recovered: the run never recorded this save; a later run "
    "found it committed and recorded it (a crash after the commit, or a checkpoint put there by "
    "someone who can write the directory), and loading it needs a person's approval"
)


def recovered_record(ledger_path: str, manifest_sha: str) -> int | None:
    """Index of the record of ``manifest_sha`` when the ledger holds it only as recovered."""
    from ds.checkpoint._verify import scan

    found = save_records(ledger_path, manifest_sha, scan(ledger_path).records)
    kinds = {rec["kind"] for _, rec in found}
    if found and "checkpoint_save" not in kinds:
        return int(found[0][1]["i"])
    return None


def checkpoint_heads(root: str, manifest: dict[str, Any]) -> tuple[list[TreeHead], list[str]]:
    """The ledger heads a checkpoint carries, and problems reading them."""
    from ds.checkpoint._verify import parse_head

    heads: list[TreeHead] = []
    problems: list[str] = []
    if manifest.get("ledger_head"):
        try:
            heads.append(parse_head(manifest["ledger_head"], "the manifest's ledger_head"))
        except LedgerError as exc:
            problems.append(str(exc))
    path = os.path.join(root, HEAD_FILE)
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                heads.append(parse_head(f.read(), path))
        except (OSError, LedgerError) as exc:
            problems.append(str(exc))
    return heads, problems


def kind_records(
    ledger_path: str, records: int, kinds: tuple[str, ...]
) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """(line, record) of each of the first ``records`` of the file whose kind is in ``kinds``.

    Only lines holding ``"kind":"<kind>"`` (as a canonical record does) are parsed, so a long
    ledger of step records is passed over at the speed of a byte search."""
    with open(ledger_path, "rb") as f:
        data = f.read()
    hits: list[int] = []
    for mark in {f'"kind":"{k}"'.encode() for k in kinds}:
        at = data.find(mark)
        while at >= 0:
            hits.append(at)
            at = data.find(mark, at + 1)
    index, at, done = 0, 0, -1  # the line starting at byte ``at`` is line ``index``
    for hit in sorted(hits):
        start = data.rfind(b"\n", 0, hit) + 1
        if start == done:
            continue  # a second mark in a line already read
        index += data.count(b"\n", at, start)
        at = done = start
        end = data.find(b"\n", start)
        if index >= records or end < 0:
            return
        try:
            rec = json.loads(data[start:end])
        except ValueError:  # not a record: nothing it says is taken
            continue
        if isinstance(rec, dict) and rec.get("kind") in kinds and isinstance(rec["payload"], dict):
            yield data[start:end], rec


def save_records(
    ledger_path: str, manifest_sha: str, records: int, kinds: tuple[str, ...] = SAVE_KINDS
) -> list[tuple[bytes, dict[str, Any]]]:
    """Every (line, record) among the first ``records`` of the file that saved ``manifest_sha``."""
    return [
        (line, dict(rec))
        for line, rec in kind_records(ledger_path, records, kinds)
        if rec["payload"].get("manifest_sha256") == manifest_sha
    ]


def find_save_record(
    ledger_path: str, manifest_sha: str, records: int, kinds: tuple[str, ...] = SAVE_KINDS
) -> dict[str, Any] | None:
    found = save_records(ledger_path, manifest_sha, records, kinds)
    return found[0][1] if found else None


def trusted_save_record(ledger: Any, manifest_sha: str) -> str | None:
    """Why ``ledger`` (the writer) does not vouch for a ``checkpoint_save`` of ``manifest_sha``
    (None when it does). With a signing key only a record the writer itself holds, covered by a
    head it signed, counts: anyone who can write the file can append a well-chained record."""
    from ds.checkpoint._verify import scan

    path = ledger.path
    signed = bool(getattr(ledger, "signed", False))
    # Signed: the writer's own count (it verified the file when it opened it, and vouches() below
    # decides); unsigned: what a chain scan of the file finds now.
    records = len(ledger) if signed else scan(path).records
    found = save_records(path, manifest_sha, records, ("checkpoint_save",))
    if not found:
        return f"this run's ledger has no record of saving it (manifest {manifest_sha[:12]})"
    if not signed:
        return None
    vouches = getattr(ledger, "vouches", None)
    if vouches is not None and any(vouches(int(rec["i"]), line) for line, rec in found):
        return None
    return (
        f"ledger {path} record {found[0][1]['i']} claims this save (manifest "
        f"{manifest_sha[:12]}), but no head signed by the writer covers it (appended by "
        "someone who can write the file)"
    )


def cross_check_ledger(
    ledger_path: str,
    root: str,
    manifest: dict[str, Any],
    manifest_sha: str,
    public_key: str | None = None,
    strict: bool = False,
) -> list[str]:
    """Problems between a checkpoint (directory ``root``) and its run ledger (empty = consistent)."""
    from ds.checkpoint._verify import verify_file

    heads, problems = checkpoint_heads(root, manifest)
    try:
        res = verify_file(ledger_path, heads, public_key, strict=strict)
    except LedgerError as exc:
        return [*problems, f"ledger {ledger_path}: {exc}"]
    if not res.ok:
        problems.append(f"ledger {ledger_path}: {res.reason}")
        if not os.path.exists(ledger_path):
            return problems
    rec = find_save_record(ledger_path, manifest_sha, res.records)
    if rec is None:
        problems.append(f"ledger {ledger_path} has no checkpoint_save record of this manifest")
        return problems
    shas = rec["payload"].get("shard_sha256", {})
    for name, info in manifest["files"].items():
        if info.get("sha256") and shas.get(name) != info["sha256"]:
            problems.append(f"ledger records a different SHA-256 for {name}")
    if strict and rec["kind"] != "checkpoint_save":
        problems.append(RECOVERED.format(i=rec["i"]) + "; --strict refuses it")
    covered = max((h.size for h in heads), default=0)
    if (public_key is not None or strict) and covered <= int(rec["i"]):
        problems.append(
            f"no head this checkpoint carries covers its ledger record {rec['i']} "
            f"({HEAD_FILE} missing or older than the save)"
        )
    return problems
