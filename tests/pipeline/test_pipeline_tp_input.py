"""Pipeline x tensor parallelism bad input, refused in one line naming the numbers and the fix
before any layer is changed (no processes: AutoTP's checks run before any collective)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _pipe_gpt import TPBlock, pipeline_module

from ds.full import pipeline
from ds.interfaces.errors import ConfigError
from ds.parallel.tp import autotp
from ds.parallel.tp._collectives import TPGroup
from ds.zero.config import load_config


def _refused(net: torch.nn.Module, tp: int) -> str:
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(ConfigError) as err:
        autotp(net, TPGroup(None, None, tp, 0), None)
    after = net.state_dict()
    assert set(after) == set(before)
    assert all(torch.equal(after[k], v) for k, v in before.items())  # left as it was
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_heads_not_dividing_by_tp_are_refused_with_the_numbers() -> None:
    # 12 features divide by 2, but 3 heads of 4 would put half a head on each rank.
    net = pipeline_module(1, block=TPBlock, block_kw={"dim": 12, "num_heads": 3})
    msg = _refused(net, 2)
    assert "module '1': num_heads=3 does not divide by tensor_parallel.autotp_size=2" in msg
    assert "choose an autotp_size that divides 3" in msg


def test_hidden_not_dividing_by_tp_is_refused_with_the_numbers() -> None:
    net = pipeline_module(1, block=TPBlock)  # dim 16, 4 heads
    msg = _refused(net, 3)
    assert "output features 16 do not divide into 3 tensor-parallel slices" in msg
    assert "choose an autotp_size dividing 16" in msg


def test_tp_not_dividing_a_stage_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        pipeline.check_stage_tp(4, 2, 4)
    msg = str(err.value)
    assert "autotp_size=4 does not divide the 2 ranks of each pipeline stage" in msg
    assert "(world 4 / pipeline.stages 2)" in msg and "\n" not in msg


def test_sequence_parallelism_with_stages_is_refused_naming_the_keys() -> None:
    cfg = load_config({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 2})
    net = pipeline_module(2, stage_id=0)
    with pytest.raises(ConfigError) as err:
        pipeline.build(cfg, None, net)  # refused before the communicator is asked anything
    msg = str(err.value)
    assert "a PipelineModule of 2 stages with sequence_parallel_size=2" in msg
    assert "set sequence_parallel_size to 1" in msg and "\n" not in msg
