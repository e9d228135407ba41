"""`ds checkpoint` and `ds ledger` verbs (called as main(argv)); exports load in transformers."""

from __future__ import annotations

import json
import os

import pytest
import torch

from ds.checkpoint import cli, ledger_cli
from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.ledger import RunLedger
from ds.checkpoint.sharding import shard_state
from ds.interfaces import registry


def _tiny_gpt2() -> tuple[object, object]:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=97, n_positions=16, tie_word_embeddings=False
    )
    torch.manual_seed(0)
    return transformers, transformers.GPT2LMHeadModel(cfg)


def test_cli_verbs_are_registered() -> None:
    assert registry.get(registry.CLI, "checkpoint") is cli.main
    assert registry.get(registry.CLI, "ledger") is ledger_cli.main


@pytest.mark.parametrize("to", ["safetensors", "torch"])
def test_export_loads_with_from_pretrained(tmp_path, to: str, capsys) -> None:
    transformers, model = _tiny_gpt2()
    sd = {f"module.{k}": v for k, v in model.state_dict().items()}
    eng = ShardedCheckpointEngine()
    eng.save(str(tmp_path / "ck"), "step1", shard_state(sd, 0, 1))
    model.config.save_pretrained(str(tmp_path / "cfg"))
    out = tmp_path / "hf"
    rc = cli.main(
        [
            "export",
            str(tmp_path / "ck"),
            "--to",
            to,
            "--out",
            str(out) + os.sep,
            "--strip-prefix",
            "module.",
            "--hf-config",
            str(tmp_path / "cfg" / "config.json"),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr()
    assert "exported" in printed.out
    # Not a terminal: progress as a line per tenth of the tensors, ending at the total.
    lines = [x for x in printed.err.splitlines() if x.startswith("export: ")]
    total = len(model.state_dict())
    assert 2 <= len(lines) <= 11 and lines[-1] == f"export: {total}/{total} tensors", lines
    loaded = transformers.GPT2LMHeadModel.from_pretrained(str(out))
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_export_casts_floating_tensors_only(tmp_path) -> None:
    from safetensors.torch import load_file

    eng = ShardedCheckpointEngine()
    ts = {"w": torch.randn(4, 4), "n": torch.arange(3)}
    eng.save(str(tmp_path / "ck"), "t", shard_state(ts, 0, 1))
    out = str(tmp_path / "w.safetensors")
    assert (
        cli.main(
            [
                "export",
                str(tmp_path / "ck"),
                "--out",
                out,
                "--dtype",
                "bf16",
                "--include",
                "w",
                "--include",
                "n",
            ]
        )
        == 0
    )
    got = load_file(out)
    assert got["w"].dtype == torch.bfloat16 and torch.equal(got["w"], ts["w"].bfloat16())
    assert got["n"].dtype == torch.int64 and torch.equal(got["n"], ts["n"])


def test_inspect_and_verify_with_ledger(tmp_path, capsys) -> None:
    with RunLedger(str(tmp_path / "l.jsonl")) as led:
        led.record_training_event("step", {"step": 1})
        eng = ShardedCheckpointEngine(ledger=led)
        state = shard_state({"w": torch.randn(10, 3)}, 0, 1)
        state.objects = {"step": 1}
        eng.save(str(tmp_path / "ck"), "s1", state)
    d = str(tmp_path / "ck")
    assert cli.main(["inspect", d]) == 0
    out = capsys.readouterr().out
    assert "s1" in out and "10x3" in out and "ledger head size 1" in out
    assert cli.main(["verify", d, "--ledger", str(tmp_path / "l.jsonl")]) == 0
    assert "OK" in capsys.readouterr().out
    shard = tmp_path / "ck" / "s1" / "shard-00000-of-00001.bin"
    data = bytearray(shard.read_bytes())
    data[0] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert cli.main(["verify", d]) == 1
    assert "shard-00000-of-00001.bin: SHA-256 differs" in capsys.readouterr().out
    assert cli.main(["inspect", str(tmp_path / "nothing")]) == 2
    # Re-sign the damage in the manifest: plain verify passes, the ledger cross-check does not.
    import hashlib

    manifest_path = tmp_path / "ck" / "s1" / "manifest.json"
    m = json.loads(manifest_path.read_text())
    m["files"]["shard-00000-of-00001.bin"]["sha256"] = hashlib.sha256(
        shard.read_bytes()
    ).hexdigest()
    manifest_path.write_text(json.dumps(m, sort_keys=True, indent=1) + "\n")
    assert cli.main(["verify", d]) == 0
    assert cli.main(["verify", d, "--ledger", str(tmp_path / "l.jsonl")]) == 1
    assert "no checkpoint_save record of this manifest" in capsys.readouterr().out


def test_ledger_verbs(tmp_path, capsys) -> None:
    path = str(tmp_path / "l.jsonl")
    with RunLedger(path) as led:
        for i in range(9):
            led.record_training_event("step" if i % 3 else "config", {"step": i})
        led.tree_head()
    assert ledger_cli.main(["verify", path]) == 0
    assert "9 records" in capsys.readouterr().out
    assert ledger_cli.main(["show", path, "--kind", "config"]) == 0
    assert capsys.readouterr().out.count("config") == 3
    assert ledger_cli.main(["prove", path, "inclusion", "4"]) == 0
    proof = json.loads(capsys.readouterr().out)
    assert proof["verified"] and proof["tree_size"] == 9
    assert ledger_cli.main(["prove", path, "consistency", "3", "9"]) == 0
    assert json.loads(capsys.readouterr().out)["verified"]
    lines = (tmp_path / "l.jsonl").read_bytes().split(b"\n")
    lines[5] = lines[5].replace(b'"step":5', b'"step":6')
    (tmp_path / "l.jsonl").write_bytes(b"\n".join(lines))
    assert ledger_cli.main(["verify", path]) == 1
    assert "first bad record 5" in capsys.readouterr().out
    assert ledger_cli.main(["keygen"]) == 0
    assert len(json.loads(capsys.readouterr().out)["private_key"]) == 64


@pytest.mark.parametrize("to", ["safetensors", "torch"])
def test_export_edge_shapes_and_dtypes(tmp_path, to: str) -> None:
    from safetensors.torch import load_file

    from ds.checkpoint import export as ex

    ts = {
        "empty": torch.empty(0, 4),
        "scalar": torch.tensor(2.5),
        "mask": torch.arange(5) > 2,
        "big": torch.randn(33, 17),
        "half": torch.randn(7).half(),
        "idx": torch.arange(6, dtype=torch.int32).view(2, 3),
    }
    eng = ShardedCheckpointEngine()
    eng.save(str(tmp_path / "ck"), "t", shard_state(ts, 0, 1))
    m = eng.manifest(str(tmp_path / "ck"))
    root = str(tmp_path / "ck" / "t")
    for dtype in (None, torch.bfloat16):
        out = str(tmp_path / f"o-{dtype}")
        plans = ex.plan_export(m, dtype=dtype)
        if to == "safetensors":
            ex.export_safetensors(m, root, out, plans)
            got = load_file(out)
        else:
            ex.export_torch(m, root, out, plans)
            got = torch.load(out, weights_only=True)
        assert set(got) == set(ts)
        for k, v in ts.items():
            want = v.to(dtype) if dtype is not None and v.is_floating_point() else v
            assert got[k].dtype == want.dtype and torch.equal(got[k], want), k
