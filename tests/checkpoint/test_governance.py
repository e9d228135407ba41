"""ds.initialize wires the ledger, the mutation boundary and the gate from the config blocks the
docs show; overwrite, delete and loads of a real run then need approvals."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ds.full as ds
from ds.checkpoint.boundary import LOAD_CHECKPOINT, OVERWRITE_CHECKPOINT
from ds.interfaces.errors import ApprovalRequiredError

BASE = {
    "train_batch_size": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
    "zero_optimization": {"stage": 2},
}


def _engine(tmp_path: Path, **blocks: object):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    cfg = {**BASE, **blocks}
    engine, *_ = ds.initialize(model=model, config=cfg)
    x = torch.randn(4, 4)
    engine.backward(engine(x).pow(2).mean())
    engine.step()
    return engine


def _kinds(path: Path) -> list[str]:
    return [json.loads(line)["kind"] for line in path.read_text().splitlines()]


def test_config_blocks_are_accepted_and_wired(tmp_path: Path) -> None:
    led = tmp_path / "run.jsonl"
    engine = _engine(
        tmp_path,
        ledger={"path": str(led), "approvals": {"watched_env": ["DS_TEST_WATCHED"]}},
        gate={"ddi_max": 20.0, "window": 5},
        checkpoint={"writer": "python", "async": False, "checksum": False},
    )
    try:
        assert engine.boundary is not None and engine.ledger is not None
        assert engine.gate is not None and engine.gate.thresholds.ddi_max == 20.0
        d = str(tmp_path / "ck")
        engine.save_checkpoint(d, tag="t")
        manifest = json.loads((tmp_path / "ck" / "t" / "manifest.json").read_text())
        assert all(f["sha256"] is None for f in manifest["files"].values())  # checksum: false
        # Overwriting the run's checkpoint needs an approval; nobody gave one.
        with pytest.raises(ApprovalRequiredError, match=OVERWRITE_CHECKPOINT):
            engine.save_checkpoint(d, tag="t")
        # Loading a checkpoint this ledger recorded is approved by the default policy ...
        path, _ = engine.load_checkpoint(d, tag="t")
        assert path is not None
        kinds = _kinds(led)
        # model state, then optimizer state, then the load itself
        assert kinds[-7:] == ["intent", "approval", "mutation"] * 2 + ["checkpoint_load"]
        recs = [json.loads(line) for line in led.read_text().splitlines()]
        assert recs[-6]["payload"]["policy"] == "recorded-checkpoint"
        assert recs[-6]["payload"]["actor"] == "policy:recorded-checkpoint"
        # ... and the run_start record holds the config without any signing key.
        assert "signing_key" not in json.dumps(recs[0]["payload"])
    finally:
        engine.ledger.close()


def test_load_of_a_checkpoint_the_ledger_never_saw_needs_approval(tmp_path: Path) -> None:
    first = _engine(tmp_path)  # no ledger: a checkpoint made outside this run's ledger
    d = str(tmp_path / "ck")
    first.save_checkpoint(d, tag="foreign")
    led = tmp_path / "run.jsonl"
    engine = _engine(tmp_path, ledger={"path": str(led)})
    try:
        with pytest.raises(ApprovalRequiredError, match=LOAD_CHECKPOINT):
            engine.load_checkpoint(d, tag="foreign")
        b = engine.boundary
        b.approve(b.request(LOAD_CHECKPOINT, str(tmp_path / "ck" / "foreign"), "alice"), "bob")
        with pytest.raises(ApprovalRequiredError, match="load_optimizer_state"):
            engine.load_checkpoint(d, tag="foreign")  # optimizer state is a second approval
        b.approve(b.request(LOAD_CHECKPOINT, str(tmp_path / "ck" / "foreign"), "alice"), "bob")
        b.approve(
            b.request("load_optimizer_state", str(tmp_path / "ck" / "foreign"), "alice"), "bob"
        )
        assert engine.load_checkpoint(d, tag="foreign")[0] is not None
        # Module-only loads need the model approval alone.
        b.approve(b.request(LOAD_CHECKPOINT, str(tmp_path / "ck" / "foreign"), "alice"), "bob")
        assert engine.load_checkpoint(d, tag="foreign", load_module_only=True)[0] is not None
    finally:
        engine.ledger.close()


@contextlib.contextmanager
def _ledgered(tmp_path: Path, **approvals: object) -> Iterator[tuple[Any, Path]]:
    """An engine (one step taken) recording to ``run.jsonl`` with these ``approvals`` settings,
    and that ledger's path; the ledger is closed after the block."""
    led = tmp_path / "run.jsonl"
    engine = _engine(tmp_path, ledger={"path": str(led), "approvals": approvals})
    try:
        yield engine, led
    finally:
        engine.ledger.close()


def test_config_policy_allows_what_the_config_lists(tmp_path: Path) -> None:
    with _ledgered(tmp_path, allow=["overwrite_checkpoint"]) as (engine, led):
        d = str(tmp_path / "ck")
        engine.save_checkpoint(d, tag="t")
        engine.save_checkpoint(d, tag="t")  # approved by policy:config, recorded as such
        recs = [json.loads(line) for line in led.read_text().splitlines()]
        approvals = [r for r in recs if r["kind"] == "approval"]
        assert approvals and approvals[-1]["payload"]["actor"] == "policy:config"


def test_watched_environment_change_needs_approval_before_a_save(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("DS_TEST_WATCHED", "ring")
    with _ledgered(tmp_path, watched_env=["DS_TEST_WATCHED"]) as (engine, led):
        d = str(tmp_path / "ck")
        engine.save_checkpoint(d, tag="a")
        monkeypatch.setenv("DS_TEST_WATCHED", "tree")
        with pytest.raises(ApprovalRequiredError, match="change_env"):
            engine.save_checkpoint(d, tag="b")
        b = engine.boundary
        b.approve(b.request("change_env", "DS_TEST_WATCHED", "alice"), "bob")
        engine.save_checkpoint(d, tag="b")
        recs = [json.loads(line) for line in led.read_text().splitlines()]
        change = [r for r in recs if r["kind"] == "env_change"]
        assert change and change[0]["payload"] == {
            "name": "DS_TEST_WATCHED",
            "old": "ring",
            "new": "tree",
        }


def _forge_save_record(led: Path, manifest: Path) -> None:
    """What anyone who can write the run directory can do: append a well-chained record."""
    import hashlib

    from ds.checkpoint import _records

    last = json.loads(led.read_bytes().split(b"\n")[-2])
    sha = hashlib.sha256(manifest.read_bytes()).hexdigest()
    payload = {
        "directory": str(manifest.parent.parent),
        "tag": manifest.parent.name,
        "manifest_sha256": sha,
        "shard_sha256": {},
    }
    line, _ = _records.encode(
        last["i"] + 1, last["t"] + 1, "checkpoint_save", 0, payload, last["hash"]
    )
    with open(led, "ab") as f:
        f.write(line + b"\n")


def test_recorded_checkpoint_trusts_only_records_under_a_signed_head(tmp_path: Path) -> None:
    from ds.checkpoint import signing

    led = tmp_path / "run.jsonl"
    key = signing.generate_key_hex()
    engine = _engine(tmp_path, ledger={"path": str(led), "signing_key": key})
    try:
        d = str(tmp_path / "ck")
        engine.save_checkpoint(d, tag="good")
        # A planted checkpoint: the same model with its weights x100, saved outside the run ...
        planted = _engine(tmp_path)
        with torch.no_grad():
            for p in planted.module.parameters():
                p.mul_(100)
        planted.save_checkpoint(d, tag="planted")
        # ... behind a forged checkpoint_save record appended to the live run's ledger.
        _forge_save_record(led, tmp_path / "ck" / "planted" / "manifest.json")
        before = [p.detach().clone() for p in engine.module.parameters()]
        with pytest.raises(ApprovalRequiredError, match="no head signed by the writer covers it"):
            engine.load_checkpoint(d, tag="planted")
        for p, q in zip(engine.module.parameters(), before):
            assert torch.equal(p, q)  # nothing was loaded
        # The run's own save is still approved by the policy.
        assert engine.load_checkpoint(d, tag="good")[0] is not None
    finally:
        engine.ledger.close_local()


def test_a_resumed_run_refuses_a_forged_ledger_and_signs_nothing(tmp_path: Path) -> None:
    from ds.checkpoint import signing
    from ds.checkpoint._reopen import LedgerBreakError
    from ds.checkpoint.ledger import heads_path
    from ds.checkpoint.ledger_cli import main as ledger_main

    led = tmp_path / "run.jsonl"
    key = signing.generate_key_hex()
    pub = signing.public_hex(signing.load_private_key(key))
    cfg = {"path": str(led), "signing_key": key}
    engine = _engine(tmp_path, ledger=cfg)
    engine.save_checkpoint(str(tmp_path / "ck"), tag="good")
    engine.ledger.close()
    _forge_save_record(led, tmp_path / "ck" / "good" / "manifest.json")
    heads = Path(heads_path(str(led))).read_bytes()
    with pytest.raises(LedgerBreakError, match=f"ds ledger recover {led}"):
        _engine(tmp_path, ledger=cfg)
    assert Path(heads_path(str(led))).read_bytes() == heads  # no head signed over the forgery
    assert ledger_main(["verify", str(led), "--public-key", pub]) == 1
    # The documented way on: a new signed segment that records the break.
    assert ledger_main(["recover", str(led), "--signing-key", key]) == 0
    engine = _engine(tmp_path, ledger=cfg)
    engine.ledger.close()
    assert _kinds(led)[0] == "ledger_break"
    assert ledger_main(["verify", str(led), "--public-key", pub]) == 0


def test_config_pins_approver_keys_and_a_signed_run_needs_the_approvers_own_key(
    tmp_path: Path,
) -> None:
    from ds.checkpoint import signing

    first = _engine(tmp_path)  # a checkpoint this run's ledger never saw
    d = str(tmp_path / "ck")
    first.save_checkpoint(d, tag="foreign")
    bob = signing.generate_key_hex()
    pub = signing.public_hex(signing.load_private_key(bob))
    ledger = {
        "path": str(tmp_path / "run.jsonl"),
        "signing_key": signing.generate_key_hex(),
        "approvals": {"approver_keys": {"bob": pub}},
    }
    engine = _engine(tmp_path, ledger=ledger)
    try:
        b = engine.boundary
        target = str(tmp_path / "ck" / "foreign")
        with pytest.raises(ApprovalRequiredError, match="must be signed with their key"):
            b.approve(b.request(LOAD_CHECKPOINT, target, "alice"), "bob")
        b.approve(b.request(LOAD_CHECKPOINT, target, "alice"), "bob", key=bob)
        assert engine.load_checkpoint(d, tag="foreign", load_module_only=True)[0] is not None
    finally:
        engine.ledger.close()
