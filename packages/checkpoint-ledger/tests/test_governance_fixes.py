"""The writer channel, approvals, honest checkpoint verify and crash consistency (items 4, 7, 8)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
from pathlib import Path

import pytest
import torch

from ds.checkpoint import _ledger_net
from ds.checkpoint.boundary import (
    LOAD_OPTIMIZER_STATE,
    OVERWRITE_CHECKPOINT,
    MutationBoundary,
    Record,
)
from ds.checkpoint.cli import main as ckpt_main
from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.ledger import RunLedger
from ds.checkpoint.sharding import shard_state
from ds.interfaces.checkpoint import LoadRequest
from ds.interfaces.errors import ApprovalRequiredError

sys.path.insert(0, str(Path(__file__).parent))
from _forgery import refused_write


def _kinds(path: Path) -> list[str]:
    return [json.loads(x)["kind"] for x in path.read_text().splitlines()]


# -- item 4: the rank-0 writer admits only holders of the job secret ----------------------------
def test_writer_channel_refuses_connections_without_the_job_secret(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("DS_LEDGER_HOST", raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    path = tmp_path / "run.jsonl"
    led = RunLedger(str(path))
    server = _ledger_net.LedgerServer(led)
    try:
        host, port = server.address
        assert host == "127.0.0.1"  # the rendezvous interface, never every interface
        assert server._server.server_address[0] == "127.0.0.1"
        # An outsider who knows the port but not the secret: refused, nothing recorded.
        refused_write(host, port, 5)
        with socket.create_connection((host, port), 5) as s:  # no handshake at all
            f = s.makefile("rwb")
            f.readline()
            f.write(json.dumps({"op": "record", "kind": "step", "payload": {}}).encode() + b"\n")
            f.flush()
            assert f.readline() == b""
        assert len(led) == 0
        # A member of the job (it got the secret over the process group) is served, and the
        # rank it is recorded as is the one it authenticated with.
        client = _ledger_net.LedgerClient((host, port), 1, server.secret)
        assert client.call("record", kind="step", payload={"ok": 1}, rank=0) == 0
        client.close()
    finally:
        server.stop()
        led.close()
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["rank"] for r in recs] == [1]


# -- item 7: approvals that hold ----------------------------------------------------------------
def test_free_text_policy_and_self_approval_are_refused() -> None:
    b = MutationBoundary()
    i = b.request(OVERWRITE_CHECKPOINT, "/c/t", requested_by="alice")
    with pytest.raises(ApprovalRequiredError, match="not a registered policy"):
        b.approve(i, "alice", policy="i-said-so")
    with pytest.raises(ApprovalRequiredError, match="not a registered policy"):
        b.approve(i, policy="i-said-so")
    with pytest.raises(ApprovalRequiredError, match="cannot approve"):
        b.approve(i, "Alice")
    with pytest.raises(ApprovalRequiredError, match="cannot approve"):
        b.approve(i, " ALICE ")
    with pytest.raises(ApprovalRequiredError, match="policy name"):
        b.approve(i, "policy:config")
    with pytest.raises(ApprovalRequiredError, match="does not approve"):
        b.approve(i, policy="keep-last-3")  # a registered policy still has to agree
    assert not b.approvals
    b.approve(i, "bob")
    assert b.require(OVERWRITE_CHECKPOINT, "/c/t") == i


def test_approvals_store_is_not_writable_from_outside(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with RunLedger(str(path)) as led:
        b = MutationBoundary(led)
        i = b.request(OVERWRITE_CHECKPOINT, "/c/t", requested_by="alice")
        fake = Record(i + 1, "approval", OVERWRITE_CHECKPOINT, "/c/t", "bob", intent=i)
        with pytest.raises(TypeError):
            b.approvals[i] = fake  # type: ignore[index]
        b._approvals[i] = (fake, "0" * 64)  # planted in private state, without the seal
        with pytest.raises(ApprovalRequiredError, match="altered outside its API"):
            b.require(OVERWRITE_CHECKPOINT, "/c/t")
    assert "mutation" not in _kinds(path) and "approval" not in _kinds(path)


def test_loading_optimizer_state_needs_its_own_approval(tmp_path: Path) -> None:
    b = MutationBoundary()
    eng = ShardedCheckpointEngine(boundary=b)
    d = str(tmp_path / "ck")
    state = shard_state({"w": torch.ones(4), "optim.exp_avg": torch.zeros(4)}, 0, 1)
    eng.save(d, "t", state)
    target = str(tmp_path / "ck" / "t")
    b.approve(b.request("load_checkpoint", target, "trainer"), "operator")
    with pytest.raises(ApprovalRequiredError, match=LOAD_OPTIMIZER_STATE):
        eng.load(d, "t", [LoadRequest("w", 0, 4), LoadRequest("optim.exp_avg", 0, 4)])
    b.approve(b.request("load_checkpoint", target, "trainer"), "operator")
    b.approve(b.request(LOAD_OPTIMIZER_STATE, target, "trainer"), "operator")
    out = eng.load(d, "t", [LoadRequest("w", 0, 4), LoadRequest("optim.exp_avg", 0, 4)])
    assert torch.equal(out.tensors["w"].local, torch.ones(4))


def test_checksum_false_is_reported_and_fails_strict(tmp_path: Path, capsys) -> None:
    d = str(tmp_path / "ck")
    ShardedCheckpointEngine(checksum=False).save(d, "t", shard_state({"w": torch.ones(4)}, 0, 1))
    assert ckpt_main(["verify", d]) == 0
    out = capsys.readouterr().out
    assert "NO checksums were recorded" in out and "match their SHA-256" not in out
    assert ckpt_main(["verify", d, "--strict"]) == 1


# -- item 8: crash consistency ------------------------------------------------------------------
def test_committed_checkpoint_without_record_is_recovered(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    d = tmp_path / "ck"
    # A saver that died after the commit rename: the checkpoint is there, the record is not.
    ShardedCheckpointEngine().save(str(d), "orphan", shard_state({"w": torch.ones(4)}, 0, 1))
    with RunLedger(str(path)) as led:
        eng = ShardedCheckpointEngine(ledger=led)
        eng.save(str(d), "next", shard_state({"w": torch.zeros(4)}, 0, 1))
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    rec = [r for r in recs if r["kind"] == "checkpoint_recovered"]
    assert len(rec) == 1 and rec[0]["payload"]["tag"] == "orphan"
    sha = hashlib.sha256((d / "orphan" / "manifest.json").read_bytes()).hexdigest()
    assert rec[0]["payload"]["manifest_sha256"] == sha
    assert ckpt_main(["verify", str(d), "--tag", "orphan", "--ledger", str(path)]) == 0


def test_stale_temporaries_of_a_dead_writer_are_removed(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    eng = ShardedCheckpointEngine()
    eng.save(str(d), "a", shard_state({"w": torch.ones(4)}, 0, 1))
    (d / ".tmp-b").mkdir()
    (d / ".tmp-b" / "shard-00000-of-00001.bin").write_bytes(b"x")
    (d / ".old-a").mkdir()
    (d / ".del-z").mkdir()
    dead = 2**22 + 12345  # beyond pid_max on a default kernel: no such process
    (d / f"latest.tmp.{dead}").write_text("a")
    eng.save(str(d), "gone", shard_state({"w": torch.ones(4)}, 0, 1))
    os.rename(d / "gone", d / ".old-gone")  # an overwrite of "gone" cut between its renames
    ShardedCheckpointEngine().save(str(d), "c", shard_state({"w": torch.ones(4)}, 0, 1))
    names = sorted(p.name for p in d.iterdir())
    # .old-a is stale (a is there); .old-gone was the only copy of gone: restored.
    assert names == ["a", "c", "gone", "latest"]


def test_resume_after_a_crash_after_commit_records_it_and_asks_a_person(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    d = tmp_path / "ck"
    ShardedCheckpointEngine().save(str(d), "t", shard_state({"w": torch.ones(4)}, 0, 1))
    with RunLedger(str(path)) as led:
        b = MutationBoundary(led, policies={"load_checkpoint": "recorded-checkpoint"})
        eng = ShardedCheckpointEngine(ledger=led, boundary=b)
        # The first thing a resumed run does is load: the unrecorded commit is recorded first,
        # but the ledger never saw that save, so its policy does not approve the load.
        with pytest.raises(ApprovalRequiredError, match="no record of saving"):
            eng.load(str(d), "t", [LoadRequest("w", 0, 4)])
        assert "checkpoint_recovered" in _kinds(path)
        b.approve(b.request("load_checkpoint", str(d / "t"), "trainer"), "operator")
        assert torch.equal(
            eng.load(str(d), "t", [LoadRequest("w", 0, 4)]).tensors["w"].local, torch.ones(4)
        )
    assert _kinds(path).count("checkpoint_recovered") == 1
