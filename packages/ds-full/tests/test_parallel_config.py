"""Tensor/sequence-parallel config: sizes read as DeepSpeed spells them, combinations ds cannot
run refused in one line before anything is built."""

from __future__ import annotations

import warnings

import pytest
import torch

from ds.full import parallel
from ds.interfaces.errors import ConfigError
from ds.zero.config import load_config
from ds.zero.engine import ZeroEngine


def _cfg(**extra: object) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config({"train_batch_size": 8, **extra})


def test_sizes_from_either_spelling() -> None:
    assert parallel.sizes(_cfg()) == parallel.ParallelSizes(1, 1)
    assert parallel.sizes(_cfg(tensor_parallel={"autotp_size": 4})).tp == 4
    assert parallel.sizes(_cfg(tensor_parallel={"tp": {"tp_size": 2}})).tp == 2
    assert parallel.sizes(_cfg(sequence_parallel_size=2)).sp == 2


def test_pipeline_stages_compose_with_tensor_parallelism() -> None:
    cfg = _cfg(tensor_parallel={"autotp_size": 2}, pipeline={"stages": 2})
    assert parallel.sizes(cfg) == parallel.ParallelSizes(2, 1)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"sequence_parallel_size": 0}, "sequence_parallel_size must be a positive integer"),
        ({"tensor_parallel": {"autotp_size": "2"}}, "autotp_size must be a positive integer"),
        (
            {"sequence_parallel_size": 2, "pipeline": {"stages": 2}},
            r"pipeline.stages=2 with sequence_parallel_size=2: .* set sequence_parallel_size to 1",
        ),
        (
            {"sequence_parallel_size": 2, "expert_parallel": {"enabled": True}},
            r"expert_parallel with .*sequence_parallel_size=2",
        ),
    ],
)
def test_bad_combinations_are_one_line_errors(extra: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parallel.sizes(_cfg(**extra))
    assert "\n" not in str(err.value)


def test_engine_without_a_mesh_refuses_a_parallel_config() -> None:
    model = torch.nn.Linear(4, 4)
    cfg = {
        "train_batch_size": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "tensor_parallel": {"autotp_size": 2},
    }
    with pytest.raises(ConfigError, match=r"autotp_size=2 .* engine got a mesh of tp=1"):
        ZeroEngine(model, cfg)
