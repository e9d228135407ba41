"""Property tests over an attacker with write access to the run directory.

Operations: append a forged record, truncate, reorder, edit a payload and re-chain, delete or
replace ``.heads``, re-sign the heads with another key, replay an old head set, and inject
records through the writer channel without the job secret. Property: a sequence that changes the
record history is detected by whoever holds the run's final head (the last checkpoint's
``ledger_head.json``); a sequence that leaves the history as it was is accepted.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ds.checkpoint import _ledger_net, _records, signing
from ds.checkpoint.ledger import RunLedger, heads_path, verify_file
from ds.interfaces.ledger import TreeHead

KEY = signing.generate_key_hex()
PUB = signing.public_hex(signing.load_private_key(KEY))
ATTACKER = signing.load_private_key(signing.generate_key_hex())


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes, TreeHead]:
    path = str(tmp_path_factory.mktemp("run") / "run.jsonl")
    with RunLedger(path, signing_key=KEY) as led:
        for i in range(9):
            led.record_training_event("checkpoint_save" if i % 4 == 3 else "step", {"i": i})
            if i % 4 == 3:
                led.tree_head()  # a commit point
    with open(path, "rb") as f, open(heads_path(path), "rb") as h:
        ledger, heads = f.read(), h.read()
    final = TreeHead(**json.loads(heads.splitlines()[-1]))
    assert final.size == 9
    return ledger, heads, final


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")[:-1]


def _rechain(records: list[dict]) -> list[bytes]:
    prev, out = _records.GENESIS, []
    for k, r in enumerate(records):
        line, prev = _records.encode(k, r["t"], r["kind"], r["rank"], r["payload"], prev)
        out.append(line)
    return out


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 1000)),
        st.tuples(st.just("truncate"), st.integers(1, 9)),
        st.tuples(st.just("reorder"), st.integers(0, 8), st.integers(0, 8)),
        st.tuples(st.just("edit_rechain"), st.integers(0, 8), st.integers(0, 3)),
        st.tuples(st.just("delete_heads")),
        st.tuples(st.just("replace_heads"), st.integers(0, 9)),
        st.tuples(st.just("resign_heads")),
        st.tuples(st.just("replay_old_heads"), st.integers(0, 3)),
        st.tuples(st.just("rewrite_same")),
    ),
    min_size=1,
    max_size=4,
)


def _apply(ops: list[tuple], ledger: bytes, heads: bytes) -> tuple[bytes, bytes | None]:
    lines = _lines(ledger)
    head_lines: list[bytes] | None = heads.splitlines()
    for op in ops:
        name = op[0]
        recs = [json.loads(x) for x in lines]
        if name == "append":
            t = recs[-1]["t"] + 1 if recs else 0.0
            prev = recs[-1]["hash"] if recs else _records.GENESIS
            line, _ = _records.encode(len(lines), t, "readiness_assessment", 0, {"x": op[1]}, prev)
            lines.append(line)
        elif name == "truncate":
            lines = lines[: max(0, len(lines) - op[1])]
        elif name == "reorder" and len(recs) > max(op[1], op[2]):
            recs[op[1]], recs[op[2]] = recs[op[2]], recs[op[1]]
            lines = _rechain(recs)
        elif name == "edit_rechain" and len(recs) > op[1]:
            recs[op[1]]["payload"] = {**recs[op[1]]["payload"], "edited": op[2]}
            lines = _rechain(recs)
        elif name == "delete_heads":
            head_lines = None
        elif name == "replace_heads":  # heads an attacker computes for the file as it now is
            from ds.checkpoint.merkle import MerkleTree

            tree = MerkleTree()
            for x in lines:
                tree.append(x)
            size = min(op[1], len(lines))
            h = signing.sign_head(None, size, tree.root(size).hex(), 1.0)
            head_lines = [json.dumps(asdict(h)).encode()]
        elif name == "resign_heads" and head_lines:
            out = []
            for x in head_lines:
                h = json.loads(x)
                new = signing.sign_head(ATTACKER, h["size"], h["root_hash"], h["timestamp"])
                out.append(json.dumps(asdict(new)).encode())
            head_lines = out
        elif name == "replay_old_heads" and head_lines:
            head_lines = head_lines[: op[1] + 1]
        elif name == "rewrite_same":  # re-encode every record unchanged: same bytes
            lines = _rechain(recs)
    new_heads = None if head_lines is None else b"".join(x + b"\n" for x in head_lines)
    return b"".join(x + b"\n" for x in lines), new_heads


def _write(ledger: bytes, heads: bytes | None) -> str:
    d = tempfile.mkdtemp()
    path = os.path.join(d, "run.jsonl")
    Path(path).write_bytes(ledger)
    if heads is not None:
        Path(heads_path(path)).write_bytes(heads)
    return path


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(OPS)
def test_history_changes_are_detected_by_the_final_head_holder(run, ops) -> None:
    ledger, heads, final = run
    new_ledger, new_heads = _apply(ops, ledger, heads)
    path = _write(new_ledger, new_heads)
    changed = _lines(new_ledger) != _lines(ledger)
    res = verify_file(path, [final], public_key=PUB, stored_heads=False)
    assert res.ok == (not changed), (ops, res)
    if changed:  # the stored-heads verification, pinned, never accepts a changed history either
        stored = verify_file(path, [final], public_key=PUB)
        assert not stored.ok, (ops, stored)


@settings(max_examples=12, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(-1, 5), st.text(max_size=8), st.sampled_from(["record", "head", "size"])
        ),
        min_size=1,
        max_size=3,
    )
)
def test_injection_through_the_writer_channel_changes_nothing(attempts) -> None:
    d = tempfile.mkdtemp()
    path = os.path.join(d, "run.jsonl")
    led = RunLedger(path, signing_key=KEY)
    led.record_training_event("step", {"i": 0})
    server = _ledger_net.LedgerServer(led, bind="127.0.0.1")
    try:
        before = Path(path).read_bytes()
        for rank, mac, op in attempts:
            with socket.create_connection(server.address, 5) as s:
                f = s.makefile("rwb")
                f.readline()
                f.write(json.dumps({"rank": rank, "mac": mac}).encode() + b"\n")
                f.write(json.dumps({"op": op, "kind": "step", "payload": {"x": 1}}).encode())
                f.write(b"\n")
                f.flush()
                assert f.readline() == b""
        assert Path(path).read_bytes() == before and len(led) == 1
    finally:
        server.stop()
        led.close()
    assert verify_file(path, public_key=PUB).ok
