"""The attacks and operator mistakes that used to get through the ledger, one test each."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ds.checkpoint import signing
from ds.checkpoint.ledger import RunLedger, heads_path, verify_file
from ds.checkpoint.ledger_cli import main as ledger_main
from ds.interfaces.errors import LedgerError

sys.path.insert(0, str(Path(__file__).parent))
from _forgery import KEY, OTHER, PUB
from _forgery import append_forged as _append_forged
from _forgery import lines as _lines
from _forgery import rechain as _rechain
from _forgery import run as _run


# -- item 1: a forged tail is not covered by any signed head ------------------------------------
def test_forged_tail_record_is_reported_and_fails_when_pinned(tmp_path: Path, capsys) -> None:
    path = tmp_path / "run.jsonl"
    _run(path)
    assert verify_file(str(path), public_key=PUB).ok  # close() signed the final head
    _append_forged(path, "readiness_assessment", {"passed": True, "score": 100.0})
    res = verify_file(str(path))
    assert res.ok and res.uncovered == 1  # chained, but no head commits to it
    assert ledger_main(["verify", str(path)]) == 0
    assert "1 records not covered by any signed tree head" in capsys.readouterr().out
    pinned = verify_file(str(path), public_key=PUB)
    assert not pinned.ok and "not covered by any signed head" in (pinned.reason or "")
    assert ledger_main(["verify", str(path), "--strict"]) == 1


# -- item 2: truncation together with the heads above it ---------------------------------------
@pytest.mark.parametrize("k", [1, 3, 5])
def test_truncation_with_its_heads_is_caught_by_the_final_head(tmp_path: Path, k) -> None:
    path = tmp_path / "run.jsonl"
    with RunLedger(str(path), signing_key=KEY) as led:
        for i in range(8):
            led.record_training_event("step", {"step": i})
        led.tree_head()
        for i in range(3):
            led.record_training_event("step", {"step": 8 + i})
    heads = Path(heads_path(str(path))).read_text().splitlines(keepends=True)
    final = json.loads(heads[-1])
    assert final["size"] == 11
    lines = _lines(path)
    path.write_bytes(b"".join(line + b"\n" for line in lines[:-k]))
    Path(heads_path(str(path))).write_text(
        "".join(h for h in heads if json.loads(h)["size"] <= 11 - k)
    )
    alone = verify_file(str(path), public_key=PUB)
    if 11 - k == 8:  # cut back exactly to a signed head: nothing in the file says otherwise
        assert alone.ok
    else:  # cut between heads: the remaining tail is covered by no signed head
        assert not alone.ok and "not covered" in (alone.reason or "")
    # Whoever holds the final head (the last checkpoint's ledger_head.json) sees the cut.
    from ds.interfaces.ledger import TreeHead

    res = verify_file(str(path), [TreeHead(**final)], public_key=PUB)
    assert not res.ok and "records were removed" in (res.reason or "")


# -- item 3: deleted or re-signed heads, a second key -------------------------------------------
def test_deleted_heads_fail_when_a_key_is_configured(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    _run(path)
    rec = [json.loads(x) for x in _lines(path)]
    rec[2]["payload"]["step"] = 99
    path.write_bytes(_rechain([json.dumps(r).encode() for r in rec]))
    os.unlink(heads_path(str(path)))
    assert not verify_file(str(path), public_key=PUB).ok
    assert not verify_file(str(path), strict=True).ok
    # The writer, which has the key, refuses to continue a keyed ledger whose heads are gone.
    with pytest.raises(LedgerError, match=r"no .*heads"):
        RunLedger(str(path), signing_key=KEY)


def test_heads_resigned_with_another_key_fail(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    _run(path)
    forged = []
    for line in Path(heads_path(str(path))).read_text().splitlines():
        h = json.loads(line)
        forged.append(
            signing.sign_head(
                signing.load_private_key(OTHER), h["size"], h["root_hash"], h["timestamp"]
            )
        )
    from dataclasses import asdict

    Path(heads_path(str(path))).write_text("".join(json.dumps(asdict(h)) + "\n" for h in forged))
    assert verify_file(str(path)).ok  # consistent within itself: only a pin can tell
    res = verify_file(str(path), public_key=PUB)
    assert not res.ok and "another key" in (res.reason or "")
    assert ledger_main(["verify", str(path), "--public-key", PUB]) == 1


def test_a_second_key_is_refused_without_a_signed_rotation(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    _run(path)
    with pytest.raises(LedgerError, match="signed by key"):
        RunLedger(str(path), signing_key=OTHER)
    # Mixing heads by two keys into the file is caught without any pin.
    with open(heads_path(str(path))) as f:
        last = json.loads(f.readlines()[-1])
    other = signing.sign_head(signing.load_private_key(OTHER), last["size"], last["root_hash"], 1.0)
    from dataclasses import asdict

    with open(heads_path(str(path)), "a") as f:
        f.write(json.dumps(asdict(other)) + "\n")
    assert not verify_file(str(path)).ok


def test_signed_key_rotation_is_followed(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    _run(path)
    with RunLedger(str(path), signing_key=KEY) as led:
        led.rotate_key(OTHER)
        led.record_training_event("step", {"after": "rotation"})
    assert verify_file(str(path), public_key=PUB).ok  # pinned to the first key, followed
    with RunLedger(str(path), signing_key=OTHER) as led:
        led.record_training_event("step", {"again": 1})
    assert verify_file(str(path), public_key=PUB).ok
    # A rotation record forged by someone without the old key is refused.
    forged = tmp_path / "forged.jsonl"
    _run(forged)
    _append_forged(
        forged,
        "key_rotation",
        {"old_public_key": PUB, "new_public_key": "00" * 32, "signature": "00" * 64},
    )
    assert not verify_file(str(forged)).ok


# -- item 5: failed appends leave nothing; one writer ---------------------------------------------
def test_failed_append_leaves_nothing_and_indices_stay_dense(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "run.jsonl"
    led = RunLedger(str(path))
    led.record_training_event("step", {"i": 0})
    real_write = os.write
    calls = {"n": 0}

    def full_disk(fd: int, data: bytes) -> int:  # the disk takes part of a record, then fills
        calls["n"] += 1
        if calls["n"] % 2:
            return real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    for _ in range(10):
        with pytest.raises(LedgerError, match="nothing of it was kept"):
            led.record_training_event("step", {"i": "lost"})
    monkeypatch.setattr(os, "write", real_write)
    assert led.record_training_event("step", {"i": 1}) == 1  # space is back
    led.close()
    indices = [json.loads(x)["i"] for x in _lines(path)]
    assert indices == [0, 1]
    assert verify_file(str(path)).ok


def test_second_writer_process_is_refused_naming_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    led = RunLedger(str(path))
    code = (
        "import sys\nfrom ds.checkpoint.ledger import RunLedger\n"
        "from ds.interfaces.errors import LedgerError\n"
        f"try:\n    RunLedger({str(path)!r})\nexcept LedgerError as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert f"process {os.getpid()}" in proc.stdout and len(proc.stdout.strip().splitlines()) == 1
    led.close()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # released at close


# -- item 6: missing files fail; malformed input is exit 2 ---------------------------------------
def test_missing_ledger_and_head_file_fail(tmp_path: Path, capsys) -> None:
    missing = str(tmp_path / "nope.jsonl")
    assert not verify_file(missing).ok
    assert ledger_main(["verify", missing]) == 1
    assert ledger_main(["verify", missing, "--public-key", PUB]) == 1
    path = tmp_path / "run.jsonl"
    _run(path)
    assert ledger_main(["verify", str(path), "--head", f"@{tmp_path / 'no-head.json'}"]) == 1


@pytest.mark.parametrize(
    "args",
    [
        ["--head", "{not json"],
        ["--head", '{"size": "x", "root_hash": 1, "timestamp": 0}'],
        ["--head", "[1, 2]"],
        ["--public-key", "zz"],
    ],
)
def test_malformed_cli_input_is_one_line_and_exit_2(tmp_path: Path, capsys, args) -> None:
    path = tmp_path / "run.jsonl"
    _run(path)
    capsys.readouterr()
    assert ledger_main(["verify", str(path), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")


# -- item 1/3: the last checkpoint carries the final head; the key can be pinned ------------------
def test_checkpoint_carries_the_final_head_and_pins_the_key(tmp_path: Path, capsys) -> None:
    import torch

    from ds.checkpoint.cli import main as ckpt_main
    from ds.checkpoint.engine import ShardedCheckpointEngine
    from ds.checkpoint.sharding import shard_state

    path, d = tmp_path / "run.jsonl", tmp_path / "ck"
    with RunLedger(str(path), signing_key=KEY) as led:
        eng = ShardedCheckpointEngine(ledger=led)
        eng.save(str(d), "t", shard_state({"w": torch.ones(4)}, 0, 1))
        save_index = len(led) - 1
        for i in range(4):
            led.record_training_event("step", {"after": i})
    final = json.loads((d / "t" / "ledger_head.json").read_text())
    assert final["size"] == len(_lines(path))  # rewritten by close(): the run's final head
    args = ["verify", str(d), "--ledger", str(path), "--public-key", PUB]
    assert ckpt_main(args) == 0
    # Cut the ledger back to the head signed at the save, with the heads after it.
    heads = Path(heads_path(str(path))).read_text().splitlines(keepends=True)
    path.write_bytes(b"".join(x + b"\n" for x in _lines(path)[: save_index + 1]))
    Path(heads_path(str(path))).write_text(
        "".join(h for h in heads if json.loads(h)["size"] <= save_index + 1)
    )
    assert verify_file(str(path), public_key=PUB).ok  # the ledger alone cannot tell
    capsys.readouterr()
    assert ckpt_main(args) == 1
    assert "records were removed" in capsys.readouterr().out
    # A pinned key other than the ledger's fails the checkpoint check too.
    other_pub = signing.public_hex(signing.load_private_key(OTHER))
    assert ckpt_main(["verify", str(d), "--ledger", str(path), "--public-key", other_pub]) == 1
