"""Single-process save/load round trips, slice reads, atomicity bookkeeping, verification."""

from __future__ import annotations

import os

import pytest
import torch

from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.sharding import even_requests, full_requests, shard_state
from ds.interfaces.checkpoint import CheckpointEngine, LoadRequest, ShardedStateDict
from ds.interfaces.errors import CheckpointError


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(7, 13, generator=g),
        "b": torch.randn(5, generator=g).to(torch.bfloat16),
        "h": torch.randn(3, 4, 2, generator=g).to(torch.float16),
        "i": torch.randint(-100, 100, (11,), generator=g, dtype=torch.int64),
        "m": torch.rand(9, generator=g) > 0.5,
        "e": torch.empty(0, 4),
    }


def _save_full(eng: ShardedCheckpointEngine, d: str, tag: str, seed: int = 0) -> dict:
    ts = _tensors(seed)
    state = shard_state(ts, 0, 1)
    state.objects = {"step": 3, "sched": {"lr": 0.1}}
    state.rank_objects = {"rng": torch.get_rng_state()}
    eng.save(d, tag, state)
    return ts


def test_engine_satisfies_protocol() -> None:
    assert isinstance(ShardedCheckpointEngine(), CheckpointEngine)


def test_round_trip_all_dtypes(tmp_path) -> None:
    eng = ShardedCheckpointEngine()
    ts = _save_full(eng, str(tmp_path), "step3")
    assert eng.latest_tag(str(tmp_path)) == "step3"
    metas = eng.metadata(str(tmp_path))
    assert {m: (tuple(metas[m].shape), metas[m].dtype) for m in metas} == {
        n: (tuple(t.shape), str(t.dtype)[6:]) for n, t in ts.items()
    }
    out = eng.load(str(tmp_path), None, full_requests(metas.values()))
    for name, t in ts.items():
        got = out.tensors[name].local.reshape(t.shape)
        assert got.dtype == t.dtype
        assert torch.equal(got, t)
    assert out.objects == {"step": 3, "sched": {"lr": 0.1}}
    assert torch.equal(out.rank_objects["rng"], torch.get_rng_state())
    assert eng.verify(str(tmp_path)) == []
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]


def test_slices_read_exact_ranges(tmp_path) -> None:
    eng = ShardedCheckpointEngine()
    ts = _save_full(eng, str(tmp_path), "t")
    flat = ts["w"].reshape(-1)
    for off, n in [(0, 1), (5, 17), (90, 1), (0, 91), (40, 0)]:
        got = eng.load(str(tmp_path), "t", [LoadRequest("w", off, n)]).tensors["w"]
        assert got.offset == off
        assert torch.equal(got.local, flat[off : off + n])


def test_bad_requests_name_the_problem(tmp_path) -> None:
    eng = ShardedCheckpointEngine()
    _save_full(eng, str(tmp_path), "t")
    with pytest.raises(CheckpointError, match="'nope' is not in the checkpoint"):
        eng.load(str(tmp_path), "t", [LoadRequest("nope", 0, 1)])
    with pytest.raises(CheckpointError, match="outside the tensor"):
        eng.load(str(tmp_path), "t", [LoadRequest("w", 90, 2)])
    with pytest.raises(CheckpointError, match="not found"):
        eng.load(str(tmp_path), "other", [])
    with pytest.raises(CheckpointError, match="no checkpoint"):
        eng.load(str(tmp_path / "empty"), None, [])


def test_partial_shards_gap_is_an_error(tmp_path) -> None:
    # A single rank saving only part of a tensor: reading the missing part must fail loudly.
    eng = ShardedCheckpointEngine()
    state = shard_state({"w": torch.arange(10.0)}, 0, 2)  # holds [0, 5) only
    eng.save(str(tmp_path), "half", state)
    assert torch.equal(
        eng.load(str(tmp_path), "half", [LoadRequest("w", 1, 3)]).tensors["w"].local,
        torch.tensor([1.0, 2.0, 3.0]),
    )
    with pytest.raises(CheckpointError, match=r"holds elements \[5, 7\)"):
        eng.load(str(tmp_path), "half", [LoadRequest("w", 3, 4)])


def test_overwrite_replaces_and_latest_moves(tmp_path) -> None:
    eng = ShardedCheckpointEngine()
    _save_full(eng, str(tmp_path), "a", seed=1)
    ts2 = _save_full(eng, str(tmp_path), "b", seed=2)
    assert eng.latest_tag(str(tmp_path)) == "b"
    ts3 = _save_full(eng, str(tmp_path), "a", seed=3)
    assert eng.latest_tag(str(tmp_path)) == "a"
    got = eng.load(str(tmp_path), "a", [LoadRequest("w", 0, 91)]).tensors["w"].local
    assert torch.equal(got, ts3["w"].reshape(-1))
    got = eng.load(str(tmp_path), "b", [LoadRequest("w", 0, 91)]).tensors["w"].local
    assert torch.equal(got, ts2["w"].reshape(-1))


def test_stale_temporary_directory_is_ignored_and_replaced(tmp_path) -> None:
    eng = ShardedCheckpointEngine()
    _save_full(eng, str(tmp_path), "a")
    stale = tmp_path / ".tmp-b"
    stale.mkdir()
    (stale / "garbage").write_bytes(b"x" * 10)
    assert eng.latest_tag(str(tmp_path)) == "a"
    _save_full(eng, str(tmp_path), "b")
    assert not stale.exists()
    assert sorted(os.listdir(tmp_path / "b")) == [
        "manifest.json",
        "objects.pt",
        "rank-00000.pt",
        "shard-00000-of-00001.bin",
    ]


def test_verify_detects_changed_and_missing_files(tmp_path) -> None:
    eng = ShardedCheckpointEngine()
    _save_full(eng, str(tmp_path), "a")
    shard = tmp_path / "a" / "shard-00000-of-00001.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 0x01
    shard.write_bytes(bytes(data))
    (tmp_path / "a" / "objects.pt").unlink()
    problems = eng.verify(str(tmp_path), "a")
    assert any("shard-00000-of-00001.bin: SHA-256 differs" in p for p in problems)
    assert any("objects.pt: missing" in p for p in problems)


def test_invalid_state_is_rejected(tmp_path) -> None:
    eng = ShardedCheckpointEngine()
    state = shard_state({"w": torch.arange(6.0)}, 0, 1)
    bad = ShardedStateDict(tensors={"x": state.tensors["w"]})
    with pytest.raises(CheckpointError, match="holds a shard of 'w'"):
        eng.save(str(tmp_path), "t", bad)
    with pytest.raises(CheckpointError, match="not usable as a directory name"):
        eng.save(str(tmp_path), "../t", state)


def test_resharding_requests_cover_everything(tmp_path) -> None:
    eng = ShardedCheckpointEngine()
    ts = _save_full(eng, str(tmp_path), "t")
    metas = eng.metadata(str(tmp_path), "t")
    for world in (2, 3, 4):
        parts = [
            eng.load(str(tmp_path), "t", even_requests(metas.values(), r, world))
            for r in range(world)
        ]
        for name, t in ts.items():
            joined = torch.cat([p.tensors[name].local for p in parts])
            assert torch.equal(joined, t.reshape(-1))


def test_failed_ledger_record_after_commit_says_the_checkpoint_is_saved(tmp_path) -> None:
    from ds.checkpoint.ledger import RunLedger

    led = RunLedger(str(tmp_path / "l.jsonl"))
    eng = ShardedCheckpointEngine(ledger=led)
    led.close()  # appends now fail
    with pytest.raises(CheckpointError, match="is saved and loadable, but recording it failed"):
        _save_full(eng, str(tmp_path / "ck"), "t")
    assert ShardedCheckpointEngine().verify(str(tmp_path / "ck"), "t") == []
    assert ShardedCheckpointEngine().latest_tag(str(tmp_path / "ck")) == "t"


def test_damaged_manifest_is_named(tmp_path) -> None:
    eng = ShardedCheckpointEngine()
    _save_full(eng, str(tmp_path), "t")
    manifest = tmp_path / "t" / "manifest.json"
    manifest.write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="not a ds sharded checkpoint manifest"):
        eng.metadata(str(tmp_path), "t")
    manifest.write_text('{"format": "ds-sharded')
    with pytest.raises(CheckpointError, match="not valid JSON"):
        eng.metadata(str(tmp_path), "t")
