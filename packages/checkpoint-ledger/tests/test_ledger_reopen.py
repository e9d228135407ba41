"""A writer continues a ledger only when everything in it is its own (the check on reopen), and
``ds ledger recover`` starts a new signed segment after a refusal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ds.checkpoint import signing
from ds.checkpoint._reopen import LedgerBreakError
from ds.checkpoint.ledger import RunLedger, heads_path, verify_file
from ds.checkpoint.ledger_cli import main as ledger_main
from ds.interfaces.errors import LedgerError

sys.path.insert(0, str(Path(__file__).parent))
from _forgery import KEY, OTHER, PUB, append_forged, lines, rechain, run


def _forge_append(path: Path) -> None:
    append_forged(path, "checkpoint_save", {"manifest_sha256": "f" * 64})


def _rewrite(path: Path) -> None:
    recs = [json.loads(x) for x in lines(path)]
    recs[2]["payload"] = {"step": 999}
    path.write_bytes(rechain([json.dumps(r).encode() for r in recs]))


def _empty_heads(path: Path) -> None:
    Path(heads_path(str(path))).write_text("")


def _cut_heads_to_first(path: Path) -> None:
    hp = Path(heads_path(str(path)))
    hp.write_text(hp.read_text().splitlines(keepends=True)[0])


def _resign_heads(path: Path) -> None:
    hp = Path(heads_path(str(path)))
    other = signing.load_private_key(OTHER)
    out = []
    for line in hp.read_text().splitlines():
        h = json.loads(line)
        out.append(
            json.dumps(signing.sign_head(other, h["size"], h["root_hash"], h["timestamp"]).__dict__)
        )
    hp.write_text("\n".join(out) + "\n")


def _resign_first_head(path: Path) -> None:
    hp = Path(heads_path(str(path)))
    lines = hp.read_text().splitlines(keepends=True)
    h = json.loads(lines[0])
    forged = signing.sign_head(
        signing.load_private_key(OTHER), h["size"], h["root_hash"], h["timestamp"]
    )
    hp.write_text(json.dumps(forged.__dict__) + "\n" + "".join(lines[1:]))


ATTACKS = {
    "append a record with a valid chain hash": [_forge_append],
    "rewrite history, empty .heads": [_rewrite, _empty_heads],
    "rewrite history, cut .heads back to the size-0 head": [_rewrite, _cut_heads_to_first],
    "cut .heads back to the size-0 head": [_cut_heads_to_first],
    "re-sign the heads with another key": [_resign_heads],
    "re-sign an old head with another key": [_resign_first_head],
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_reopen_refuses_what_the_writer_did_not_write(tmp_path: Path, attack: str) -> None:
    path = tmp_path / "run.jsonl"
    run(path)
    for step in ATTACKS[attack]:
        step(path)
    heads_before = Path(heads_path(str(path))).read_bytes()
    with pytest.raises(LedgerBreakError) as exc:
        RunLedger(str(path), signing_key=KEY)
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg and f"ds ledger recover {path}" in msg
    # Nothing was signed over the forgery, and the file is left as it was found.
    assert Path(heads_path(str(path))).read_bytes() == heads_before
    with pytest.raises(LedgerBreakError):  # still refused: refusing changed nothing
        RunLedger(str(path), signing_key=KEY)


def test_a_different_key_is_an_operator_error_not_a_break(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    run(path)
    with pytest.raises(LedgerError) as exc:
        RunLedger(str(path), signing_key=OTHER)
    assert not isinstance(exc.value, LedgerBreakError) and "open it with that key" in str(exc.value)
    assert ledger_main(["recover", str(path), "--signing-key", OTHER]) == 2
    assert RunLedger(str(path), signing_key=KEY).close() is None


WRITER = """
import os, sys
from ds.checkpoint.ledger import RunLedger
led = RunLedger(sys.argv[1], signing_key=sys.argv[2])
for i in range(5):
    led.record_training_event("step", {"step": i})
led.tree_head()
for i in range(5, 9):
    led.record_training_event("step", {"step": i})
os._exit(0)  # a crash: no close, no head over the last four records
"""


def test_records_of_a_crashed_writer_are_adopted_by_its_seal(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    subprocess.run([sys.executable, "-c", WRITER, str(path), KEY], check=True, timeout=120)
    assert not verify_file(str(path), public_key=PUB).ok  # 4 records no signed head covers
    with RunLedger(str(path), signing_key=KEY) as led:
        assert len(led) == 9  # continued: the seal vouches the tail is the writer's own
        led.record_training_event("step", {"step": 9})
    assert verify_file(str(path), public_key=PUB).ok


def test_a_forged_record_after_a_crash_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    subprocess.run([sys.executable, "-c", WRITER, str(path), KEY], check=True, timeout=120)
    _forge_append(path)
    with pytest.raises(LedgerBreakError, match="not sealed by this writer"):
        RunLedger(str(path), signing_key=KEY)


def test_removed_tail_below_the_seal_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    subprocess.run([sys.executable, "-c", WRITER, str(path), KEY], check=True, timeout=120)
    path.write_bytes(b"".join(x + b"\n" for x in lines(path)[:6]))  # drop 3 sealed records
    with pytest.raises(LedgerBreakError, match="records were removed"):
        RunLedger(str(path), signing_key=KEY)


def test_recover_starts_a_new_signed_segment_recording_the_break(tmp_path: Path, capsys) -> None:
    path = tmp_path / "run.jsonl"
    run(path)
    _forge_append(path)
    forged = path.read_bytes()
    assert ledger_main(["recover", str(path), "--signing-key", KEY]) == 0
    assert "RECOVERED" in capsys.readouterr().out
    evidence = tmp_path / "run.jsonl.broken-1"
    assert evidence.read_bytes() == forged and Path(heads_path(str(evidence))).exists()
    recs = [json.loads(x) for x in lines(path)]
    assert [r["kind"] for r in recs] == ["ledger_break"]
    brk = recs[0]["payload"]
    assert brk["previous"] == str(evidence) and brk["previous_records"] == 8
    assert brk["previous_last_signed_head"]["size"] == 7 and "records 7..7" in brk["problem"]
    assert verify_file(str(path), public_key=PUB).ok
    with RunLedger(str(path), signing_key=KEY) as led:  # the run goes on
        led.record_training_event("step", {"step": 0})
    assert ledger_main(["recover", str(path), "--signing-key", KEY]) == 0
    assert "nothing to recover" in capsys.readouterr().out


def test_recover_of_a_signed_ledger_needs_the_key(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv(signing.ENV_KEY, raising=False)
    path = tmp_path / "run.jsonl"
    run(path)
    _forge_append(path)
    assert ledger_main(["recover", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no signing key is configured" in err
    assert not (tmp_path / "run.jsonl.broken-1").exists()


def test_an_uncaught_refusal_is_one_line_and_exit_3(tmp_path: Path) -> None:
    # A scheduler tells a broken history (a person must look) from a crash (resubmit) by the
    # status alone; other ds errors keep Python's 1.
    path = tmp_path / "run.jsonl"
    run(path)
    _forge_append(path)
    code = (
        "import atexit, ds.checkpoint.ledger as L; atexit.register(print, 'atexit ran'); "
        f"L.RunLedger({str(path)!r}, signing_key={str(KEY)!r})"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("ds: LedgerBreakError: ") and f"ds ledger recover {path}" in line
    assert out.stdout.strip() == "atexit ran"
