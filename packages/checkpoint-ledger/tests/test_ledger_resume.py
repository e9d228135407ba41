"""A keyed writer's reopen resumes from its sealed state (``ds.checkpoint._resume``) instead of
re-reading every record, and what that fast path trusts cannot be forged by whoever can write the
run directory: a record rewritten anywhere in the sealed prefix is still refused."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from ds.checkpoint import _resume, merkle, signing
from ds.checkpoint._ledger_check import save_records
from ds.checkpoint._reopen import LedgerBreakError
from ds.checkpoint.ledger import RunLedger, heads_path, verify_file

sys.path.insert(0, str(Path(__file__).parent))
from _forgery import KEY, OTHER, PUB, lines, rechain, run

MAC = signing.seal_key(signing.load_private_key(KEY))


def _sealed(path: Path) -> None:
    """The fast path applies to ``path`` as it is: a valid state, its prefix and heads intact."""
    got = _resume.open_scan(str(path), MAC)
    assert got is not None
    s, heads, vouched = got
    assert s.reason is None and vouched == len(heads) and s.records == len(lines(path))


def _edit_middle(path: Path, rechained: bool) -> None:
    raw = lines(path)
    rec = json.loads(raw[3])
    rec["payload"] = {"step": 300}
    if rechained:
        raw[3] = json.dumps(rec).encode()
        path.write_bytes(rechain(raw))
        return
    raw[3] = raw[3].replace(b'{"step":3}', b'{"step":9}')  # tail bytes left exactly as they were
    path.write_bytes(b"".join(x + b"\n" for x in raw))


def test_reopen_resumes_and_holds_the_same_tree(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    run(path, n=40)
    _sealed(path)
    tree = merkle.MerkleTree()
    for line in lines(path):
        tree.append(line)
    with RunLedger(str(path), signing_key=KEY) as led:
        assert len(led) == len(tree) and led.root_hash() == tree.root().hex()
        led.record_training_event("step", {"step": 41})  # appended before the prefix is loaded
        assert led.leaf_hash(3) == tree.leaves[3].hex()  # one leaf: read from the checked prefix
        assert led.vouches(40, lines(path)[40]) and not led.vouches(3, lines(path)[4])
        assert led.root_hash(17) == tree.root(17).hex()  # loads the sealed prefix's leaves
        assert led.prove_inclusion(5, 30) == [h.hex() for h in tree.inclusion_proof(5, 30)]
        assert led.prove_consistency(9, 41) == [h.hex() for h in tree.consistency_proof(9, 41)]
        assert led.leaf_hash(41) == merkle.leaf_hash(lines(path)[41]).hex()
    assert verify_file(str(path), public_key=PUB).ok
    _sealed(path)


@pytest.mark.parametrize("rechained", [False, True], ids=["tail-intact", "rechained"])
def test_a_record_rewritten_in_the_sealed_prefix_is_refused(
    tmp_path: Path, rechained: bool
) -> None:
    path = tmp_path / "run.jsonl"
    run(path, n=40)
    _sealed(path)
    _edit_middle(path, rechained)
    assert _resume.open_scan(str(path), MAC) is None  # the prefix no longer has its digest
    with pytest.raises(LedgerBreakError):
        RunLedger(str(path), signing_key=KEY)


def test_an_older_state_put_back_only_moves_where_checking_starts(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with RunLedger(str(path), signing_key=KEY) as led:
        for i in range(10):
            led.record_training_event("step", {"step": i})
        led.tree_head()
        old = tmp_path / "old.state"
        shutil.copy(_resume.state_path(str(path)), old)
        for i in range(10, 30):
            led.record_training_event("step", {"step": i})
    raw = lines(path)
    rec = json.loads(raw[20])
    rec["payload"] = {"step": 99}
    raw[20] = json.dumps(rec).encode()
    path.write_bytes(rechain(raw))  # after the old state's offset, chain recomputed
    shutil.copy(old, _resume.state_path(str(path)))
    got = _resume.open_scan(str(path), MAC)
    assert got is not None and got[0].records == 30  # the old state applies: 10 sealed, 20 read
    with pytest.raises(LedgerBreakError, match="history rewritten"):
        RunLedger(str(path), signing_key=KEY)


@pytest.mark.parametrize("state", ["garbled", "another key's", "missing"])
def test_a_useless_state_means_the_full_check(tmp_path: Path, state: str) -> None:
    path = tmp_path / "run.jsonl"
    run(path)
    sp = Path(_resume.state_path(str(path)))
    if state == "garbled":
        sp.write_bytes(sp.read_bytes().replace(b'"records":', b'"records":1'))
    elif state == "another key's":
        st = _resume.read(str(path), MAC)
        assert st is not None
        _resume.write(str(path), signing.seal_key(signing.load_private_key(OTHER)), st)
    else:
        sp.unlink()
    assert _resume.open_scan(str(path), MAC) is None
    with RunLedger(str(path), signing_key=KEY) as led:  # an intact ledger still opens
        assert len(led) == 7
    _sealed(path)  # and the writer sealed a fresh state


def test_a_file_changed_after_the_open_is_refused_when_its_leaves_are_needed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.jsonl"
    run(path, n=20)
    led = RunLedger(str(path), signing_key=KEY)
    try:
        _edit_middle(path, rechained=True)
        with pytest.raises(LedgerBreakError, match="changed after this writer opened it"):
            led.leaf_hash(3)
        with pytest.raises(LedgerBreakError, match="changed after this writer opened it"):
            led.prove_inclusion(3)
    finally:
        led.close_local()


def test_key_rotations_are_carried_by_the_state(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    run(path)
    with RunLedger(str(path), signing_key=KEY) as led:
        led.rotate_key(OTHER)
        led.record_training_event("step", {"step": 8})
    other_mac = signing.seal_key(signing.load_private_key(OTHER))
    got = _resume.open_scan(str(path), other_mac)
    assert got is not None and [i for i, _ in got[0].rotations] == [7]
    with RunLedger(str(path), signing_key=OTHER) as led:
        led.record_training_event("step", {"step": 9})
    assert verify_file(str(path), public_key=PUB).ok


def test_a_head_appended_after_the_sealed_state_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    run(path)
    with RunLedger(str(path), signing_key=KEY) as led:
        root, size = led.root_hash(), len(led)
    forged = signing.sign_head(signing.load_private_key(OTHER), size, root, 1.0)
    with open(heads_path(str(path)), "a", encoding="utf-8") as f:
        f.write(json.dumps(forged.__dict__) + "\n")
    got = _resume.open_scan(str(path), MAC)
    assert got is not None and got[2] == len(got[1]) - 1  # resumed; the new head is not vouched
    with pytest.raises(LedgerBreakError, match="not signed by the key in effect"):
        RunLedger(str(path), signing_key=KEY)


def test_save_records_are_found_by_their_kind_among_the_first_records(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    a, b = "a" * 64, "b" * 64
    with RunLedger(str(path), signing_key=KEY) as led:
        led.record_training_event(
            "step", {"note": {"kind": "checkpoint_save", "manifest_sha256": a}}
        )
        led.record_training_event(
            "checkpoint_save", {"manifest_sha256": a, "kind": "checkpoint_save"}
        )
        led.record_training_event("checkpoint_recovered", {"manifest_sha256": b})
    assert [r["i"] for _, r in save_records(str(path), a, 3)] == [1]  # not the step, only once
    assert [r["i"] for _, r in save_records(str(path), b, 3)] == [2]
    assert save_records(str(path), b, 2) == []  # beyond the records asked for
    assert save_records(str(path), b, 3, ("checkpoint_save",)) == []
