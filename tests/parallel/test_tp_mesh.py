"""The mesh's groups on a real gloo world of 4, and AutoTP over the mesh's TP group (TP=2 x DP=2)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _tp_launch import run_world

from ds.interfaces.parallel import MeshShape
from ds.parallel.mesh import group_ranks

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return run_world("mesh", 4, tmp_path_factory.mktemp("mesh"), "2", "1")


def test_each_group_reduces_over_the_ranks_it_names(world: Any) -> None:
    shape = MeshShape(dp=2, sp=1, tp=2)
    for rank, info in enumerate(world["ranks"]):
        d = info["describe"]
        assert d["rank"] == rank and d["sizes"] == {"dp": 2, "sp": 1, "tp": 2}
        for dim in ("dp", "sp", "tp", "dp_sp"):
            mine = next(g for g in group_ranks(shape, dim) if rank in g)
            assert d["groups"][dim] == list(mine)
            assert d["index"][dim] == mine.index(rank)
            # an all-reduce of each rank's own number over the group sums exactly its members
            assert info["sums"][dim] == float(sum(mine))
    assert world["ranks"][1]["describe"]["groups"]["tp"] == [0, 1]
    assert world["ranks"][1]["describe"]["groups"]["dp"] == [1, 3]


def test_autotp_on_the_mesh_tp_group_with_dp_averaging_matches(world: Any) -> None:
    r = world["tp_dp"]
    assert r["grads"].keys() == r["ref_grads"].keys()
    for name, ref in r["ref_grads"].items():
        err = float((r["grads"][name] - ref).abs().max() / ref.abs().max())
        assert err <= 1e-5, (name, err)
