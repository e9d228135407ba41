"""Ledger chain, Merkle commitments, signed heads, torn tails and tamper detection."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ds.checkpoint import _records, signing
from ds.checkpoint.ledger import RunLedger, heads_path, read_heads, verify_file
from ds.checkpoint.merkle import leaf_hash, verify_consistency, verify_inclusion
from ds.interfaces.errors import LedgerError
from ds.interfaces.ledger import Ledger, TreeHead

KEY = signing.generate_key_hex()
N = 12


def _build(path: str, n: int = N, key: str | None = KEY) -> TreeHead:
    with RunLedger(path, signing_key=key) as led:
        for i in range(n):
            kind = "checkpoint_save" if i % 5 == 4 else "step"
            led.record_training_event(kind, {"step": i, "loss": 1.0 / (i + 1)})
        return led.tree_head()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    path = str(tmp_path_factory.mktemp("ledger") / "run.jsonl")
    _build(path)
    with open(path, "rb") as f, open(heads_path(path), "rb") as h:
        return f.read(), h.read()


def _written(ledger_bytes: bytes, heads_bytes: bytes) -> str:
    """A ledger file in a fresh directory holding ``ledger_bytes``, its heads ``heads_bytes``."""
    path = os.path.join(tempfile.mkdtemp(), "run.jsonl")
    with open(path, "wb") as f:
        f.write(ledger_bytes)
    with open(heads_path(path), "wb") as f:
        f.write(heads_bytes)
    return path


def _verify(ledger_bytes: bytes, heads_bytes: bytes) -> object:
    pub = json.loads(heads_bytes.splitlines()[0])["public_key"]
    return verify_file(_written(ledger_bytes, heads_bytes), public_key=pub)


def test_is_a_ledger_and_verifies(tmp_path) -> None:
    path = str(tmp_path / "l.jsonl")
    head = _build(path)
    led = RunLedger(path, signing_key=KEY)
    assert isinstance(led, Ledger)
    res = led.verify_ledger_integrity()
    assert res.ok and res.records == N and res.signed
    assert head.size == N and signing.verify_head_signature(
        head, signing.public_hex(signing.load_private_key(KEY))
    )
    # Reopening continues the chain.
    assert led.record_training_event("step", {"step": N}) == N
    assert led.verify_ledger_integrity().ok
    led.close()


def test_unsigned_heads_are_stated(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(signing.ENV_KEY, raising=False)
    path = str(tmp_path / "l.jsonl")
    head = _build(path, key=None)
    assert head.signature is None
    res = verify_file(path)
    assert res.ok and not res.signed
    # Requiring a key rejects unsigned heads.
    assert not verify_file(path, public_key=KEY[:64]).ok


def test_key_from_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(signing.ENV_KEY, KEY)
    path = str(tmp_path / "l.jsonl")
    head = _build(path, key=None)
    assert head.signature is not None


def test_inclusion_proof_of_each_record_against_signed_head(tmp_path) -> None:
    path = str(tmp_path / "l.jsonl")
    head = _build(path)
    lines = Path(path).read_bytes().splitlines()
    pub = signing.public_hex(signing.load_private_key(KEY))
    assert signing.verify_head_signature(head, pub)
    with RunLedger(path, signing_key=KEY) as led:
        for i, line in enumerate(lines):
            proof = [bytes.fromhex(p) for p in led.prove_inclusion(i, head.size)]
            assert verify_inclusion(
                leaf_hash(line), i, head.size, proof, bytes.fromhex(head.root_hash)
            )
            assert not verify_inclusion(
                leaf_hash(line + b" "), i, head.size, proof, bytes.fromhex(head.root_hash)
            )


def test_consistency_proofs_and_fork(tmp_path) -> None:
    path = str(tmp_path / "l.jsonl")
    _build(path)
    with RunLedger(path, signing_key=KEY) as led:
        for old in range(0, N + 1):
            for new in range(old, N + 1):
                proof = [bytes.fromhex(p) for p in led.prove_consistency(old, new)]
                assert verify_consistency(
                    old,
                    new,
                    bytes.fromhex(led.root_hash(old)),
                    bytes.fromhex(led.root_hash(new)),
                    proof,
                )
        # A fork: same first 6 records, then a different history.
        fork_path = str(tmp_path / "fork.jsonl")
        with open(path, "rb") as f:
            prefix = b"".join(f.readlines()[:6])
        with open(fork_path, "wb") as f:
            f.write(prefix)
        with RunLedger(fork_path) as fork:
            for i in range(6):
                fork.record_training_event("step", {"step": 100 + i})
            for old in range(7, N + 1):
                proof = [bytes.fromhex(p) for p in led.prove_consistency(old, N)]
                assert not verify_consistency(
                    old,
                    N,
                    bytes.fromhex(fork.root_hash(old)),
                    bytes.fromhex(led.root_hash(N)),
                    proof,
                )


def test_torn_last_line_is_reported_and_recovered(tmp_path) -> None:
    path = str(tmp_path / "l.jsonl")
    _build(path)
    with open(path, "ab") as f:
        f.write(b'{"hash":"abc","i":12,"ki')
    res = verify_file(path)
    assert not res.ok and res.first_bad_index == N and "torn last line" in (res.reason or "")
    with pytest.raises(LedgerError, match="torn last line"):
        RunLedger(path, signing_key=KEY)
    with RunLedger(path, signing_key=KEY, recover_torn_tail=True) as led:
        assert led.verify_ledger_integrity().ok
    lines = Path(path).read_bytes().splitlines()
    assert json.loads(lines[-1])["kind"] == "torn_tail_recovered"
    assert any(p.startswith("l.jsonl.torn-") for p in os.listdir(tmp_path))


def _on_drawn_data(examples: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A property test over the ``base`` ledger: ``examples`` runs, each drawing from ``data``."""
    return lambda test: settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )(given(st.data())(test))


def test_clean_base_verifies(base: tuple[bytes, bytes]) -> None:
    res = _verify(*base)
    assert res.ok and res.signed  # type: ignore[attr-defined]


@_on_drawn_data(80)
def test_any_byte_flip_is_detected(base: tuple[bytes, bytes], data: st.DataObject) -> None:
    led, heads = base
    pos = data.draw(st.integers(0, len(led) - 1))
    bit = data.draw(st.integers(0, 7))
    tampered = bytearray(led)
    tampered[pos] ^= 1 << bit
    assert not _verify(bytes(tampered), heads).ok  # type: ignore[attr-defined]


def _lines(led: bytes) -> list[bytes]:
    return led.split(b"\n")[:-1]


def _join(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


def _lines_and_one(
    base: tuple[bytes, bytes], data: st.DataObject
) -> tuple[list[bytes], bytes, int]:
    """The base ledger's record lines, its heads and the index of one drawn record."""
    led, heads = base
    lines = _lines(led)
    return lines, heads, data.draw(st.integers(0, len(lines) - 1))


@_on_drawn_data(40)
def test_deleted_inserted_reordered_truncated_records_are_detected(
    base: tuple[bytes, bytes], data: st.DataObject
) -> None:
    lines, heads, i = _lines_and_one(base, data)
    op = data.draw(st.sampled_from(["delete", "insert", "swap", "truncate"]))
    if op == "delete":
        lines.pop(i)
    elif op == "insert":
        j = data.draw(st.integers(0, len(lines) - 1))
        lines.insert(i, lines[j])
    elif op == "swap":
        j = data.draw(st.integers(0, len(lines) - 1).filter(lambda j: j != i))
        lines[i], lines[j] = lines[j], lines[i]
    else:
        lines = lines[:i]
    res = _verify(_join(lines), heads)
    assert not res.ok, op  # type: ignore[attr-defined]


@_on_drawn_data(25)
def test_rewritten_history_with_a_valid_chain_is_caught_by_the_head(
    base: tuple[bytes, bytes], data: st.DataObject
) -> None:
    # An attacker re-encodes the whole chain after changing one payload: the chain verifies, the
    # signed head does not.
    lines, heads, i = _lines_and_one(base, data)
    prev = _records.GENESIS
    out = []
    for k, line in enumerate(lines):
        rec = json.loads(line)
        payload = rec["payload"]
        if k == i:
            payload = {**payload, "loss": 123.0}
        new, prev = _records.encode(k, rec["t"], rec["kind"], rec["rank"], payload, prev)
        out.append(new)
    res = _verify(_join(out), heads)
    assert not res.ok and "tree head" in (res.reason or "")  # type: ignore[attr-defined]


@_on_drawn_data(40)
def test_forged_tree_head_is_detected(base: tuple[bytes, bytes], data: st.DataObject) -> None:
    led, heads = base
    head = json.loads(heads.splitlines()[0])
    field = data.draw(
        st.sampled_from(["size", "root_hash", "timestamp", "signature", "public_key"])
    )
    if field == "size":
        head["size"] = data.draw(st.integers(0, 40).filter(lambda s: s != head["size"]))
    elif field == "timestamp":
        head["timestamp"] += data.draw(st.floats(1, 1e6))
    else:
        raw = bytearray(bytes.fromhex(head[field]))
        raw[data.draw(st.integers(0, len(raw) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        head[field] = raw.hex()
    path = _written(led, (json.dumps(head) + "\n").encode())
    pub = json.loads(heads.splitlines()[0])["public_key"]
    assert not verify_file(path, public_key=pub).ok
    assert read_heads(path)[0].size == head["size"]


def test_closed_ledger_refuses_appends(tmp_path) -> None:
    led = RunLedger(str(tmp_path / "l.jsonl"))
    led.close()
    with pytest.raises(LedgerError, match="closed"):
        led.record_training_event("step", {})


def test_corrupt_ledger_refuses_to_open(tmp_path) -> None:
    path = str(tmp_path / "l.jsonl")
    _build(path)
    data = bytearray(Path(path).read_bytes())
    data[30] ^= 1
    Path(path).write_bytes(bytes(data))
    with pytest.raises(LedgerError, match="record 0"):
        RunLedger(path)


def test_attach_records_steps_config_and_checkpoint_loads(tmp_path) -> None:
    import torch

    from ds.checkpoint.engine import ShardedCheckpointEngine
    from ds.checkpoint.sharding import shard_state
    from ds.interfaces.checkpoint import LoadRequest
    from ds.interfaces.telemetry import ConfigEvent, EventBus, StepMetrics

    bus = EventBus()
    with RunLedger(str(tmp_path / "l.jsonl")) as led:
        led.attach(bus)
        bus.publish(ConfigEvent({"zero_optimization": {"stage": 3}}, {"NCCL_ALGO": "ring"}))
        bus.publish(StepMetrics(step=1, loss=2.0, lr=0.1, step_time_s=0.3))
        eng = ShardedCheckpointEngine(ledger=led, events=bus)
        state = shard_state({"w": torch.arange(4.0)}, 0, 1)
        state.objects = {"step": 1}
        eng.save(str(tmp_path / "ck"), "s1", state)
        eng.load(str(tmp_path / "ck"), None, [LoadRequest("w", 0, 4)])
        assert led.verify_ledger_integrity().ok
    recs = [json.loads(x) for x in (tmp_path / "l.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in recs] == ["config", "step", "checkpoint_save", "checkpoint_load"]
    assert recs[0]["payload"]["env"] == {"NCCL_ALGO": "ring"}
    assert recs[1]["payload"]["loss"] == 2.0
    assert recs[2]["payload"]["manifest_sha256"] == recs[3]["payload"]["manifest_sha256"]
    assert recs[3]["payload"]["step"] == 1
    assert bus.errors == []


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(), children, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None)
@given(
    st.text(min_size=1),
    st.dictionaries(st.text(), _json_values, max_size=5),
    st.integers(0, 2**40),
    st.integers(0, 4096),
    st.floats(0, 4e9, allow_nan=False),
)
def test_fast_encoding_is_the_canonical_form(kind, payload, index, rank, t) -> None:
    line, h = _records.encode(index, t, kind, rank, payload, _records.GENESIS)
    got, problem, rec = _records.check(line, index, _records.GENESIS)
    assert problem is None and got == h
    assert rec["kind"] == kind and rec["payload"] == payload
