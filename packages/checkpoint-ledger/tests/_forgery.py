"""What someone who can write the run directory (but has no signing key) does to a ledger."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from ds.checkpoint import _records, signing
from ds.checkpoint.ledger import RunLedger

KEY = signing.generate_key_hex()
PUB = signing.public_hex(signing.load_private_key(KEY))
OTHER = signing.generate_key_hex()


def run(path: Path, n: int = 6, key: str | None = KEY) -> None:
    """A small run: n steps, a head, a save after it; close() signs the final head."""
    with RunLedger(str(path), signing_key=key) as led:
        for i in range(n):
            led.record_training_event("step", {"step": i})
        led.tree_head()
        led.record_training_event("checkpoint_save", {"step": n})


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


def append_forged(path: Path, kind: str, payload: dict) -> None:
    """Append a record with a valid chain hash (no key needed)."""
    last = json.loads(lines(path)[-1])
    line, _ = _records.encode(last["i"] + 1, last["t"] + 1, kind, 0, payload, last["hash"])
    with open(path, "ab") as f:
        f.write(line + b"\n")


def rechain(raw: list[bytes]) -> bytes:
    """The records of ``raw`` (JSON lines, possibly edited) with the hash chain recomputed."""
    prev, out = _records.GENESIS, []
    for k, text in enumerate(raw):
        rec = json.loads(text)
        line, prev = _records.encode(k, rec["t"], rec["kind"], rec["rank"], rec["payload"], prev)
        out.append(line + b"\n")
    return b"".join(out)


def refused_write(host: str, port: int, timeout: float = 10.0) -> None:
    """An outsider who knows the writer's port but not the job's secret: its handshake and
    record are refused, the connection closed without a reply."""
    with socket.create_connection((host, port), timeout) as s:
        f = s.makefile("rwb")
        assert "nonce" in json.loads(f.readline())
        f.write(json.dumps({"rank": 1, "mac": "00" * 32}).encode() + b"\n")
        f.write(json.dumps({"op": "record", "kind": "step", "payload": {}}).encode() + b"\n")
        f.flush()
        assert f.readline() == b""  # closed without a reply
