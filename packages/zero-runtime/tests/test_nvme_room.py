"""NVMe offload onto a path without room is refused before anything is written, naming the bytes
needed and available; the bytes it counts are the bytes the swap files take."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _stage3 import stage3
from torch import nn

from ds.interfaces.errors import ConfigError
from ds.interfaces.registry import get
from ds.zero.stage3 import shard_of
from ds.zero.stage3.nvme_room import SwapNeed, check_room, stage3_needs

SMALL = 1 << 20  # the test filesystem's size


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB filesystem (tmpfs), mounted for the test."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={SMALL}", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False, timeout=30)


def _nvme(path: Path) -> dict[str, dict[str, object]]:
    return {
        "offload_param": {"device": "nvme", "nvme_path": str(path)},
        "offload_optimizer": {"device": "nvme", "nvme_path": str(path)},
    }


def _engine(model: nn.Module, path: Path):  # type: ignore[no-untyped-def]
    return stage3(
        model,
        torch.optim.AdamW(model.parameters(), lr=1e-2),
        kernels=get("ds.kernels", "cpu")(),
        config={"aio": {"block_size": 4096, "queue_depth": 2}},
        stage3_param_persistence_threshold=0,
        **_nvme(path),
    )


def test_no_room_is_refused_before_writing(small_fs: Path) -> None:
    # 262,656 fp32 parameters: 1 MiB of shards plus 3 MiB of master and moments.
    model = nn.Linear(512, 512)
    with pytest.raises(ConfigError) as err:
        _engine(model, small_fs / "swap")
    msg = str(err.value)
    assert "\n" not in msg
    assert str(small_fs / "swap") in msg
    assert "offload_param 1.00 MiB (1,052,672 bytes)" in msg
    assert "offload_optimizer 3.01 MiB (3,158,016 bytes)" in msg
    assert "needs 4.02 MiB (4,210,688 bytes)" in msg
    assert f"only 1.00 MiB ({SMALL:,} bytes) is available" in msg
    assert "more room" in msg and "device 'cpu'" in msg
    assert not (small_fs / "swap").exists()  # nothing was written


def test_room_enough_trains(small_fs: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(32, 32)
    rt = _engine(model, small_fs)
    x = torch.randn(4, 32)
    losses = []
    for _ in range(3):
        loss = model(x).pow(2).mean()
        rt.backward(loss)
        rt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    rt.destroy()


def test_counted_bytes_equal_the_swap_files(tmp_path: Path) -> None:
    """What the check counts is what the swap files hold once the engine is built."""
    model = nn.Sequential(nn.Embedding(37, 12), nn.Linear(12, 5), nn.Linear(5, 37))
    rt = _engine(model, tmp_path)
    zero = rt.config.zero
    states = [shard_of(p) for p in model.parameters()]
    needs = {n.section: n.nbytes for n in stage3_needs(zero, states, states, 0)}
    strategy = rt.strategy
    assert needs["offload_param"] == strategy.partitioner.swapper.file.size > 0
    assert needs["offload_optimizer"] == strategy.opt._swap.size > 0
    # The file ends where its last region's data ends, within the last alignment block.
    assert needs["offload_optimizer"] - 4096 < os.path.getsize(strategy.opt._swap.path)
    rt.destroy()


def test_ranks_on_the_node_and_old_swap_files(small_fs: Path) -> None:
    need = [SwapNeed("offload_param", str(small_fs), 600 << 10)]
    check_room(need, local_ranks=1)
    with pytest.raises(ConfigError, match=r"per rank x 2 ranks on this node"):
        check_room(need, local_ranks=2)
    # A swap file left by an earlier run is truncated when the run starts: its space counts.
    (small_fs / "ds_zero3_params_rank0.swp").write_bytes(b"\1" * (800 << 10))
    check_room([SwapNeed("offload_param", str(small_fs), 900 << 10)], local_ranks=1)
    with pytest.raises(ConfigError, match=r"offload_param .*offload_optimizer"):
        check_room(
            [
                SwapNeed("offload_param", str(small_fs), 900 << 10),
                SwapNeed("offload_optimizer", str(small_fs / "opt"), 200 << 10),
            ]
        )
