"""Mutation boundaries: intents are never approvals; approvals are distinct ledger records."""

from __future__ import annotations

import json

import pytest
import torch

from ds.checkpoint.boundary import (
    CHANGE_ENV,
    LOAD_CHECKPOINT,
    OVERWRITE_CHECKPOINT,
    MutationBoundary,
    Record,
    never_equate_intent_to_approval,
)
from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.ledger import RunLedger
from ds.checkpoint.sharding import shard_state
from ds.interfaces.errors import ApprovalRequiredError


def _approval(index: int, approver: str, intent: int) -> Record:
    return Record(index, "approval", "delete_checkpoint", "/c/t1", approver, intent=intent)


def test_never_equate_intent_to_approval_rule() -> None:
    intent = Record(3, "intent", "delete_checkpoint", "/c/t1", "alice")
    refused = [
        (None, "has no approval"),
        (intent, "its own approval"),
        (_approval(3, "bob", 3), "its own approval"),  # the intent's own index
        (_approval(4, "alice", 3), "cannot approve it"),
        (_approval(4, "bob", 2), "not this one"),
        (_approval(2, "bob", 3), "predates"),
        (_approval(5, "", 3), "names no approver"),
    ]
    for approval, why in refused:
        with pytest.raises(ApprovalRequiredError, match=why):
            never_equate_intent_to_approval(intent, approval)
    never_equate_intent_to_approval(intent, _approval(5, "bob", 3))


def test_intent_alone_does_not_allow_the_mutation(tmp_path) -> None:
    with RunLedger(str(tmp_path / "l.jsonl")) as led:
        b = MutationBoundary(led)
        intent = b.request("load_optimizer_state", "/ckpt/step9", requested_by="alice")
        with pytest.raises(ApprovalRequiredError, match=f"intent #{intent}"):
            b.require("load_optimizer_state", "/ckpt/step9")
        with pytest.raises(ApprovalRequiredError, match="cannot approve"):
            b.approve(intent, "alice")
        approval = b.approve(intent, "bob", reason="resume after node loss")
        assert approval != intent
        assert b.require("load_optimizer_state", "/ckpt/step9") == intent
        with pytest.raises(ApprovalRequiredError):  # one approval, one mutation
            b.require("load_optimizer_state", "/ckpt/step9")
        kinds = [
            json.loads(line)["kind"] for line in (tmp_path / "l.jsonl").read_text().splitlines()
        ]
        assert kinds == ["intent", "approval", "mutation"]
        assert led.verify_ledger_integrity().ok


def test_policy_approval_is_a_separate_record(tmp_path) -> None:
    with RunLedger(str(tmp_path / "l.jsonl")) as led:
        b = MutationBoundary(
            led, policies={"delete_checkpoint": "config"}, config_allows={"delete_checkpoint": True}
        )
        b.require("delete_checkpoint", "/c/old")
    recs = [json.loads(line) for line in (tmp_path / "l.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in recs] == ["intent", "approval", "mutation"]
    assert recs[1]["payload"]["policy"] == "config"
    assert recs[1]["payload"]["actor"] == "policy:config"
    assert recs[1]["payload"]["intent"] == recs[0]["i"]


def test_checkpoint_overwrite_needs_approval(tmp_path) -> None:
    b = MutationBoundary()
    eng = ShardedCheckpointEngine(boundary=b)
    d = str(tmp_path / "ck")
    eng.save(d, "t", shard_state({"w": torch.zeros(4)}, 0, 1))
    with pytest.raises(ApprovalRequiredError, match="overwrite_checkpoint"):
        eng.save(d, "t", shard_state({"w": torch.ones(4)}, 0, 1))
    with pytest.raises(ApprovalRequiredError, match="load_checkpoint"):
        eng.load(d, "t", [])
    b.approve(b.request(LOAD_CHECKPOINT, str(tmp_path / "ck" / "t"), "trainer"), "operator")
    assert eng.load(d, "t", []).objects == {}
    intent = b.request(OVERWRITE_CHECKPOINT, str(tmp_path / "ck" / "t"), requested_by="trainer")
    b.approve(intent, "operator")
    eng.save(d, "t", shard_state({"w": torch.ones(4)}, 0, 1))
    from ds.interfaces.checkpoint import LoadRequest

    b.approve(b.request(LOAD_CHECKPOINT, str(tmp_path / "ck" / "t"), "trainer"), "operator")
    assert torch.equal(eng.load(d, "t", [LoadRequest("w", 0, 4)]).tensors["w"].local, torch.ones(4))


def test_watched_env_change_needs_approval(monkeypatch) -> None:
    monkeypatch.setenv("NCCL_ALGO", "ring")
    b = MutationBoundary(watched_env=["NCCL_ALGO"])
    assert b.check_env() == []
    monkeypatch.setenv("NCCL_ALGO", "tree")
    with pytest.raises(ApprovalRequiredError, match="change_env"):
        b.check_env()
    b.approve(b.request(CHANGE_ENV, "NCCL_ALGO", requested_by="alice"), "bob")
    assert b.check_env() == ["NCCL_ALGO"]
    assert b.check_env() == []


def test_checkpoint_delete_needs_approval_and_is_recorded(tmp_path) -> None:
    from ds.interfaces.errors import CheckpointError

    with RunLedger(str(tmp_path / "l.jsonl")) as led:
        b = MutationBoundary(led)
        eng = ShardedCheckpointEngine(boundary=b, ledger=led)
        d = str(tmp_path / "ck")
        eng.save(d, "old", shard_state({"w": torch.zeros(4)}, 0, 1))
        eng.save(d, "new", shard_state({"w": torch.ones(4)}, 0, 1))
        with pytest.raises(ApprovalRequiredError, match="delete_checkpoint"):
            eng.delete(d, "old")
        with pytest.raises(CheckpointError, match="'latest' names"):
            eng.delete(d, "new")
        b.approve(
            b.request("delete_checkpoint", str(tmp_path / "ck" / "old"), "trainer"), "operator"
        )
        eng.delete(d, "old")
        assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["latest", "new"]
        assert led.verify_ledger_integrity().ok
    kinds = [json.loads(x)["kind"] for x in (tmp_path / "l.jsonl").read_text().splitlines()]
    assert kinds[-4:] == ["intent", "approval", "mutation", "checkpoint_delete"]
