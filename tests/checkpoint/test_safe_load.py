"""Checkpoint loads check the recorded SHA-256 of what they read and unpickle weights-only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from ds.checkpoint.engine import ShardedCheckpointEngine
from ds.checkpoint.sharding import full_requests, shard_state
from ds.interfaces.errors import CheckpointError


def _save(d: Path, *, checksum: bool = True) -> dict[str, torch.Tensor]:
    ts = {"module.w": torch.arange(24.0).reshape(4, 6), "module.b": torch.ones(6)}
    state = shard_state(ts, 0, 1)
    state.objects = {"step": 3, "client_state": {"epoch": 1}}
    state.rank_objects = {"rng.torch": torch.get_rng_state()}
    ShardedCheckpointEngine(checksum=checksum).save(str(d), "t1", state)
    return ts


def _load(d: Path, ts: dict[str, torch.Tensor]) -> object:
    eng = ShardedCheckpointEngine()
    metas = eng.metadata(str(d), "t1")
    return eng.load(str(d), "t1", full_requests(list(metas.values())))


def test_intact_checkpoint_loads(tmp_path: Path) -> None:
    ts = _save(tmp_path)
    out = _load(tmp_path, ts)
    torch.testing.assert_close(out.tensors["module.w"].local, ts["module.w"].reshape(-1))  # type: ignore[attr-defined]
    assert out.objects["client_state"] == {"epoch": 1}  # type: ignore[attr-defined]


def test_tampered_shard_is_refused_naming_the_file(tmp_path: Path) -> None:
    ts = _save(tmp_path)
    shard = next((tmp_path / "t1").glob("shard-*.bin"))
    data = bytearray(shard.read_bytes())
    data[8] ^= 0x01  # one flipped bit inside module.* elements: a plausible weight, a wrong hash
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{shard.name}: SHA-256 .* differs") as err:
        _load(tmp_path, ts)
    assert "nothing was loaded" in str(err.value)


def test_tampered_objects_are_refused(tmp_path: Path) -> None:
    ts = _save(tmp_path)
    objects = tmp_path / "t1" / "objects.pt"
    torch.save({"step": 99, "client_state": {}}, objects)  # a valid pickle, not the saved one
    with pytest.raises(CheckpointError, match=r"objects\.pt: SHA-256"):
        _load(tmp_path, ts)


def test_pickled_code_is_not_run_even_without_hashes(tmp_path: Path) -> None:
    """A checkpoint saved without checksums still never unpickles arbitrary objects."""
    ts = _save(tmp_path, checksum=False)
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.mkdir, (str(marker),))

    torch.save({"step": 3, "client_state": Evil()}, tmp_path / "t1" / "objects.pt")
    with pytest.raises(CheckpointError, match=r"objects\.pt holds an object ds will not unpickle"):
        _load(tmp_path, ts)
    assert not marker.exists()
