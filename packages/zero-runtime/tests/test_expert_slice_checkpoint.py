"""Checkpoints of expert parameters that are one rank's rows of a stacked tensor
(ds.interfaces.moe.ExpertSlice): saved as the logical [4, 3, 5] tensor, loaded back bit for bit
at the same layout, and at one process (all four rows) as the union of both ranks' rows; the
16-bit export joins the rows; with tensor parallelism the expert keys stay unsuffixed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from expert_slice_worker import FULL, config, model
from world import run_script

from ds.interfaces import registry
from ds.interfaces.moe import ExpertSlice, ReplicaGroup
from ds.zero.engine import ZeroEngine
from ds.zero.engine_export import _stacked

WORKER = Path(__file__).with_name("expert_slice_worker.py")
ALONE = ReplicaGroup("ep_size_1", None, (0,))


def _world(tmp: Path, layout: str) -> list[dict[Any, Any]]:
    run_script(WORKER, 2, lambda r, port: [str(r), port, str(tmp), layout], timeout=200)
    return [torch.load(tmp / f"{layout}_rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def ep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[Any, Any]]]:
    tmp = tmp_path_factory.mktemp("expert_slice")
    return tmp, _world(tmp, "ep")


@pytest.fixture(scope="module")
def tp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[Any, Any]]]:
    tmp = tmp_path_factory.mktemp("expert_slice_tp")
    return tmp, _world(tmp, "tp")


def _single(stage: int, directory: Path) -> ZeroEngine:
    """One process holding all four rows, loaded from the world of two's checkpoint."""
    engine = ZeroEngine(
        model(0, FULL[0], ALONE),
        config(stage, 1),
        checkpoint_engine=registry.get(registry.CHECKPOINT_ENGINES, "default")(None),
    )
    engine.load_checkpoint(str(directory), "t")
    return engine


def _joined(ranks: list[dict[str, Any]], key: str) -> torch.Tensor:
    """The logical tensor ``key`` from both ranks' shards, each element placed at its offset."""
    shape = next(shards[key][1] for shards in ranks if key in shards)
    whole = torch.full((int(torch.tensor(shape).prod()),), float("nan"))
    for shards in ranks:
        if key in shards:  # a rank's partition may hold none of a parameter
            offset, _, local = shards[key]
            whole[offset : offset + local.numel()] = local.float()
    return whole


def per_stage(test: Any) -> Any:
    """Each of stages 0, 1 and 2, from the one world of two the module's tests share."""
    return pytest.mark.timeout(240)(pytest.mark.parametrize("stage", [0, 1, 2])(test))


def _rows(ranks: list[dict[Any, Any]], stage: int, name: str) -> torch.Tensor:
    """Both ranks' rows of parameter ``name`` after training, stacked in rank (row) order."""
    return torch.cat([r[stage]["params"][name] for r in ranks])


def _round_trips(got: dict[str, Any], rank: int) -> None:
    """A fresh engine loaded from the checkpoint holds what was saved, bit for bit."""
    assert got["saved"].keys() == got["loaded"].keys()
    for key, saved in got["saved"].items():
        loaded = got["loaded"][key]
        assert loaded[:2] == saved[:2] and torch.equal(loaded[2], saved[2]), (rank, key)
    for name, p in got["params"].items():
        assert torch.equal(got["loaded_params"][name], p), (rank, name)


@per_stage
def test_same_layout_round_trip(ep: tuple[Path, list[dict[Any, Any]]], stage: int) -> None:
    for rank, res in enumerate(ep[1]):
        got = res[stage]
        assert any(k.startswith("master.") for k in got["saved"])  # bf16: fp32 masters apart
        assert {"optim.exp_avg.experts", "optim.exp_avg_sq.experts"} <= got["saved"].keys()
        _round_trips(got, rank)
        for key, (offset, shape, _) in got["saved"].items():
            if key.endswith(".experts"):
                assert shape == FULL and offset == rank * 2 * 15, key  # rows [2r, 2r + 2)


@per_stage
def test_one_process_loads_every_rank_rows(ep: tuple[Path, list[Any]], stage: int) -> None:
    tmp, ranks = ep
    saved = [r[stage]["saved"] for r in ranks]
    engine = _single(stage, tmp / f"ep{stage}")
    mine = {k: t.local for k, t in engine.strategy.state_dict().tensors.items()}
    assert mine.keys() == saved[0].keys() | saved[1].keys()
    for key, local in mine.items():  # module weights, fp32 masters, Adam moments
        assert torch.equal(local.float(), _joined(saved, key)), key
    for name in ("experts", "scale"):  # trained, and frozen (saved apart as frozen.scale)
        assert torch.equal(getattr(engine.module, name).detach(), _rows(ranks, stage, name))
    assert torch.equal(engine.module.dense.weight, ranks[0][stage]["params"]["dense.weight"])


@per_stage
def test_16bit_export_holds_the_stacked_tensor(ep: tuple[Path, list[Any]], stage: int) -> None:
    weights = torch.load(ep[0] / f"ep{stage}" / "weights.pt", weights_only=True)
    assert tuple(weights["experts"].shape) == FULL and tuple(weights["scale"].shape) == FULL[:2]
    for name in ("experts", "scale"):
        assert torch.equal(weights[name], _rows(ep[1], stage, name))


@pytest.mark.timeout(240)
def test_tensor_parallel_keys_of_expert_rows_are_unsuffixed(
    tp: tuple[Path, list[dict[Any, Any]]],
) -> None:
    tmp, ranks = tp
    meta = registry.get(registry.CHECKPOINT_ENGINES, "default")(None).metadata(str(tmp / "tp1"), "t")
    assert "module.experts" in meta and tuple(meta["module.experts"].shape) == FULL
    assert "frozen.scale" in meta and tuple(meta["frozen.scale"].shape) == FULL[:2]
    assert "module.dense.weight@tp1of2" in meta and "module.dense.weight" not in meta
    for rank, res in enumerate(ranks):  # same TP size: each rank reads its own keys back
        _round_trips(res[1], rank)
    engine = _single(1, tmp / "tp1")  # TP 2 -> 1: experts joined, dense from TP rank 0
    for name in ("experts", "scale"):
        assert torch.equal(getattr(engine.module, name).detach(), _rows(ranks, 1, name)), name
    assert torch.equal(engine.module.dense.weight, ranks[0][1]["params"]["dense.weight"])


@pytest.mark.timeout(60)
def test_metadata_and_requests_place_the_rows() -> None:
    m = model(2, 2, ALONE)  # rows [2, 4) of [4, 3, 5], alone in its replica group
    engine = ZeroEngine(m, config(1, 1))
    engine.backward(engine(torch.randn(2, 5).bfloat16()).float().square().mean())
    engine.step()
    tensors = engine.strategy.state_dict().tensors
    for key in ("module.experts", "master.experts", "optim.exp_avg.experts"):
        assert tuple(tensors[key].meta.shape) == FULL and tensors[key].offset == 30, key
        assert tensors[key].local.numel() == 30
    assert tuple(tensors["module.dense.weight"].meta.shape) == (5, 5)
    metas = {k: t.meta for k, t in tensors.items()}
    reqs = {r.name: r for r in engine.strategy.load_requests(metas)}
    assert (reqs["master.experts"].offset, reqs["master.experts"].numel) == (30, 30)
    assert reqs["optim.exp_avg.experts"].offset == 30


def test_export_rows_must_tile_the_tensor() -> None:
    rows = {0: torch.zeros(2, 3), 2: torch.ones(2, 3)}
    assert torch.equal(_stacked("w", rows, 4), torch.cat([rows[0], rows[2]]))
    with pytest.raises(Exception, match="do not tile its 6 rows"):
        _stacked("w", rows, 6)
    with pytest.raises(Exception, match=r"start at rows \[0, 3\]"):
        _stacked("w", {0: rows[0], 3: rows[2]}, 4)


def test_expert_slice_offset() -> None:
    assert ExpertSlice(FULL, 2).element_offset == 30
