"""The mesh's sizes, layout and bad input (groups over a real process group: tests/parallel)."""

from __future__ import annotations

import pytest

from ds.interfaces.errors import ConfigError
from ds.interfaces.parallel import MeshShape, ParallelMesh
from ds.parallel.mesh import Mesh, build_mesh, group_ranks, mesh_shape_from_config


def test_shape_from_config_gives_dp_the_rest() -> None:
    assert mesh_shape_from_config(8, tp=2, sp=1) == MeshShape(dp=4, sp=1, tp=2)
    assert mesh_shape_from_config(8, tp=1, sp=4) == MeshShape(dp=2, sp=4, tp=1)
    assert mesh_shape_from_config(8, tp=2, sp=2) == MeshShape(dp=2, sp=2, tp=2)
    assert mesh_shape_from_config(1) == MeshShape()


@pytest.mark.parametrize(
    ("world", "tp", "sp", "words"),
    [
        (6, 4, 1, ["autotp_size=4", "world size 6", "divisor of 6"]),
        (8, 2, 3, ["sequence_parallel_size=3", "= 4", "divisor of 4"]),
        (4, 0, 1, ["autotp_size", "positive integer", "0"]),
        (4, 1, -2, ["sequence_parallel_size", "-2"]),
    ],
)
def test_shape_from_config_refuses_what_does_not_divide(
    world: int, tp: int, sp: int, words: list[str]
) -> None:
    with pytest.raises(ConfigError) as e:
        mesh_shape_from_config(world, tp, sp)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg


@pytest.mark.parametrize("shape", [MeshShape(2, 2, 2), MeshShape(4, 1, 2), MeshShape(1, 3, 2)])
def test_groups_follow_the_contract_layout(shape: MeshShape) -> None:
    world = shape.world_size
    for dim, axis in (("dp", 0), ("sp", 1), ("tp", 2)):
        groups = group_ranks(shape, dim)
        # every rank in exactly one group of each dimension
        assert sorted(r for g in groups for r in g) == list(range(world))
        for g in groups:
            coords = [shape.coords(r) for r in g]
            # the group varies only its own axis, in index order
            assert [c[axis] for c in coords] == list(range(len(g)))
            others = {tuple(c[i] for i in range(3) if i != axis) for c in coords}
            assert len(others) == 1
    for g in group_ranks(shape, "dp_sp"):
        assert len({shape.coords(r)[2] for r in g}) == 1  # one tp index
        assert len(g) == shape.dp * shape.sp
    # tensor-parallel neighbours are adjacent ranks
    assert group_ranks(shape, "tp")[0] == tuple(range(shape.tp))


def test_unknown_dimension_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown mesh dimension 'xy'"):
        group_ranks(MeshShape(), "xy")


class _World:
    """The smallest real communicator surface build_mesh uses, for a one-rank world."""

    def __init__(self, world: int, rank: int = 0) -> None:
        self.world, self.rank, self.created = world, rank, []

    def get_world_size(self, group: object = None) -> int:
        return self.world

    def get_rank(self, group: object = None) -> int:
        return self.rank

    def new_group(self, ranks: list[int]) -> tuple[int, ...]:
        self.created.append(tuple(ranks))
        return tuple(ranks)


def test_build_mesh_refuses_a_shape_that_is_not_the_world() -> None:
    with pytest.raises(ConfigError) as e:
        build_mesh(_World(4), MeshShape(dp=1, sp=1, tp=2))
    msg = str(e.value)
    assert "= 2 ranks" in msg and "world has 4" in msg and "product is 4" in msg


def test_every_rank_creates_every_group_in_the_same_order() -> None:
    shape = MeshShape(dp=2, sp=1, tp=2)
    orders = []
    meshes = []
    for rank in range(4):
        w = _World(4, rank)
        meshes.append(build_mesh(w, shape))
        orders.append(w.created)
    assert all(o == orders[0] for o in orders)
    m = meshes[3]
    assert isinstance(m, ParallelMesh) and isinstance(m, Mesh)
    assert m.ranks("tp") == (2, 3) and m.ranks("dp") == (1, 3) and m.ranks("sp") == (3,)
    assert m.index("tp") == 1 and m.index("dp") == 1 and m.group("dp") == (1, 3)
    d = m.describe()
    assert d["sizes"] == {"dp": 2, "sp": 1, "tp": 2}
    assert d["index"] == {"dp": 1, "sp": 0, "tp": 1, "dp_sp": 1}
    assert d["groups"]["dp_sp"] == [1, 3]


def test_pipeline_stages_are_outermost() -> None:
    shape = MeshShape(dp=2, sp=1, tp=2, pp=2)
    assert shape.world_size == 8 and shape.stage_size == 4
    for rank in range(8):
        d, s, t = shape.coords(rank)
        assert shape.rank_of(d, s, t, shape.pp_index(rank)) == rank
    assert [shape.pp_index(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    # a pp group links the same (dp, sp, tp) coordinates across stages
    assert group_ranks(shape, "pp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    # every other group stays inside one stage
    for dim in ("dp", "sp", "tp", "dp_sp"):
        groups = group_ranks(shape, dim)
        assert sorted(r for g in groups for r in g) == list(range(8))
        assert all(len({shape.pp_index(r) for r in g}) == 1 for g in groups)
    assert group_ranks(shape, "dp") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    # pp = 1 keeps the layout the engine had before pipelines
    assert group_ranks(MeshShape(2, 1, 2), "dp") == [(0, 2), (1, 3)]


def test_shape_from_config_with_stages() -> None:
    assert mesh_shape_from_config(8, tp=2, pp=2) == MeshShape(dp=2, sp=1, tp=2, pp=2)
    with pytest.raises(ConfigError) as e:
        mesh_shape_from_config(6, pp=4)
    msg = str(e.value)
    assert "num_stages=4" in msg and "world size 6" in msg and "\n" not in msg


def test_build_mesh_with_stages_makes_pp_groups() -> None:
    shape = MeshShape(dp=2, pp=2)
    meshes = [build_mesh(_World(4, rank), shape) for rank in range(4)]
    assert meshes[1].ranks("pp") == (1, 3) and meshes[1].index("pp") == 0
    assert meshes[3].ranks("dp") == (2, 3) and meshes[3].index("pp") == 1
    assert meshes[3].describe()["sizes"] == {"dp": 2, "sp": 1, "tp": 1, "pp": 2}
    # without stages no pp group is created and the rank is its own stage
    one = build_mesh(_World(2, 1), MeshShape(dp=2))
    assert one.ranks("pp") == (1,) and one.index("pp") == 0
