"""Approvers are people: look-alike names are one person or refused, and with a signing key a
person approves with their own pinned key, so nobody approves "as carol"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds.checkpoint import signing
from ds.checkpoint.boundary import LOAD_CHECKPOINT, MutationBoundary
from ds.checkpoint.ledger import RunLedger
from ds.checkpoint.ledger_cli import main as ledger_main
from ds.interfaces.errors import ApprovalRequiredError, ConfigError

LOOKALIKES = {
    "dotted capital I": "al\u0130ce",
    "zero-width space": "al\u200bice",
    "soft hyphen": "al\u00adice",
    "Cyrillic a": "\u0430lice",
    "combining accent": "alice\u0301",
    "precomposed accent": "alic\u00e9",
    "full-width letters": "\uff41\uff4c\uff49\uff43\uff45",
    "case and space": " ALICE ",
}


@pytest.mark.parametrize("what", list(LOOKALIKES))
def test_a_lookalike_of_the_requester_cannot_approve(tmp_path: Path, what: str) -> None:
    with RunLedger(str(tmp_path / "run.jsonl")) as led:
        b = MutationBoundary(led)
        intent = b.request(LOAD_CHECKPOINT, "/ck/t", "alice")
        with pytest.raises(ApprovalRequiredError) as exc:
            b.approve(intent, LOOKALIKES[what])
        assert "\n" not in str(exc.value)
        with pytest.raises(ApprovalRequiredError):
            b.require(LOAD_CHECKPOINT, "/ck/t")  # nothing was approved
    kinds = [json.loads(x)["kind"] for x in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert "approval" not in kinds


def test_invisible_and_mixed_script_names_are_refused_naming_the_character() -> None:
    b = MutationBoundary()
    with pytest.raises(ApprovalRequiredError, match="U\\+200B ZERO WIDTH SPACE"):
        b.request(LOAD_CHECKPOINT, "/ck/t", "b\u200bob")
    intent = b.request(LOAD_CHECKPOINT, "/ck/t", "bob")
    with pytest.raises(ApprovalRequiredError, match="mixes letters of CYRILLIC and LATIN"):
        b.approve(intent, "c\u0430rol")
    b.approve(intent, "Carol")  # a different person, in one script
    assert b.require(LOAD_CHECKPOINT, "/ck/t") == intent


KEYS = {name: signing.generate_key_hex() for name in ("ops", "bob", "carol")}
PUBS = {name: signing.public_hex(signing.load_private_key(k)) for name, k in KEYS.items()}


def _signed(tmp_path: Path) -> tuple[RunLedger, MutationBoundary]:
    led = RunLedger(str(tmp_path / "run.jsonl"), signing_key=KEYS["ops"])
    return led, MutationBoundary(led, approver_keys={"Bob": PUBS["bob"], "carol": PUBS["carol"]})


def test_with_a_signing_key_an_approval_is_signed_by_the_approvers_pinned_key(
    tmp_path: Path,
) -> None:
    led, b = _signed(tmp_path)
    with led:
        intent = b.request(LOAD_CHECKPOINT, "/ck/t", "alice")
        with pytest.raises(ApprovalRequiredError, match="must be signed with their key"):
            b.approve(intent, "carol")  # a name alone is not carol
        with pytest.raises(ApprovalRequiredError, match="not by 'carol'"):
            b.approve(intent, "carol", key=KEYS["bob"])  # bob approving as carol
        with pytest.raises(ApprovalRequiredError, match="no pinned public key"):
            b.approve(intent, "mallory", key=signing.generate_key_hex())
        other = b.request(LOAD_CHECKPOINT, "/ck/u", "alice")
        replay = signing.load_private_key(KEYS["carol"]).sign(b"for another intent").hex()
        with pytest.raises(ApprovalRequiredError, match="not by 'carol'"):
            b.approve(other, "carol", signature=replay)
        b.approve(intent, "carol", key=KEYS["carol"])
        assert b.require(LOAD_CHECKPOINT, "/ck/t") == intent
    recs = [json.loads(x) for x in (tmp_path / "run.jsonl").read_text().splitlines()]
    approvals = [r["payload"] for r in recs if r["kind"] == "approval"]
    assert len(approvals) == 1 and approvals[0]["public_key"] == PUBS["carol"]


def test_an_approver_signs_with_the_cli_and_the_signature_is_accepted(
    tmp_path: Path, capsys
) -> None:
    led, b = _signed(tmp_path)
    with led:
        intent = b.request(LOAD_CHECKPOINT, "/ck/t", "alice")
        args = ["sign-approval", led.path, str(intent), "--approver", "BOB", "--key", KEYS["bob"]]
        assert ledger_main(args) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["target"] == "/ck/t" and out["approver"] == "bob"
        b.approve(intent, "bob", signature=out["signature"])
        assert b.require(LOAD_CHECKPOINT, "/ck/t") == intent
        assert (
            ledger_main(
                ["sign-approval", led.path, str(intent + 1), "--approver", "bob", "--key", "k"]
            )
            == 2
        )


def test_pinned_keys_are_checked_when_the_boundary_is_built() -> None:
    with pytest.raises(ConfigError, match="64 hex characters"):
        MutationBoundary(approver_keys={"bob": "xyz"})
    with pytest.raises(ConfigError, match="twice"):
        MutationBoundary(approver_keys={"bob": PUBS["bob"], "BOB": PUBS["carol"]})
    with pytest.raises(ConfigError, match="invisible"):
        MutationBoundary(approver_keys={"b\u00adob": PUBS["bob"]})
