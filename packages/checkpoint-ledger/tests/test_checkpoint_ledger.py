"""Checkpoints and the ledger together: each save is provably in the log under a signed head."""

from __future__ import annotations

import hashlib
import json

import torch

from ds.checkpoint import signing
from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.ledger import RunLedger
from ds.checkpoint.merkle import leaf_hash, verify_consistency, verify_inclusion
from ds.checkpoint.sharding import shard_state
from ds.interfaces.ledger import TreeHead


def test_every_checkpoint_proves_inclusion_and_its_embedded_head_is_consistent(tmp_path) -> None:
    key = signing.generate_key_hex()
    pub = signing.public_hex(signing.load_private_key(key))
    path = tmp_path / "run.jsonl"
    ck = str(tmp_path / "ck")
    with RunLedger(str(path), signing_key=key) as led:
        eng = ShardedCheckpointEngine(ledger=led)
        for step in range(1, 4):
            for s in range(3):
                led.record_training_event("step", {"step": step * 10 + s})
            state = shard_state({"w": torch.full((16,), float(step))}, 0, 1)
            state.objects = {"step": step}
            eng.save(ck, f"step{step}", state)
        final = led.tree_head()
        assert signing.verify_head_signature(final, pub)
        lines = path.read_bytes().splitlines()
        root = bytes.fromhex(final.root_hash)
        saves = [i for i, line in enumerate(lines) if json.loads(line)["kind"] == "checkpoint_save"]
        assert len(saves) == 3
        for step, index in enumerate(saves, start=1):
            rec = json.loads(lines[index])
            manifest_path = tmp_path / "ck" / f"step{step}" / "manifest.json"
            # The ledger record names this manifest by digest...
            assert (
                rec["payload"]["manifest_sha256"]
                == hashlib.sha256(manifest_path.read_bytes()).hexdigest()
            )
            # ...the record is in the log under the signed head...
            proof = [bytes.fromhex(h) for h in led.prove_inclusion(index, final.size)]
            assert verify_inclusion(leaf_hash(lines[index]), index, final.size, proof, root)
            # ...and the head embedded in the manifest is a signed prefix of the same log.
            embedded = TreeHead(**json.loads(manifest_path.read_text())["ledger_head"])
            assert signing.verify_head_signature(embedded, pub)
            assert embedded.size == index  # taken just before the save record was appended
            cons = [bytes.fromhex(h) for h in led.prove_consistency(embedded.size, final.size)]
            assert verify_consistency(
                embedded.size, final.size, bytes.fromhex(embedded.root_hash), root, cons
            )
        assert led.verify_ledger_integrity().ok
