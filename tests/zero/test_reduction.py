"""Gradient averaging options on a real gloo world of 2 ranks: ``prescale_gradients``,
``gradient_predivide_factor``, ``gradient_allreduce_op`` and ``communication_data_type`` change
where the division by the world size happens (or that there is none) and which dtype the
reduction runs in, at stages 0, 1 and 2."""

from __future__ import annotations

import math

import pytest
import torch
from _compare import worst_loss_error, worst_weight_error

from conftest import scenario

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(420)]

STAGES = [0, 1, 2]


PROBE_NUMEL = 64


def _values(result: dict, stage: int) -> list[float]:
    """The probe's reduced gradient: rank 0's full copy at stage 0, else the ranks' partitions in
    rank order (padding cut off)."""
    ranks = [torch.cat([s.reshape(-1) for s in shards]) for shards in result["shards"]]
    flat = ranks[0] if stage == 0 else torch.cat(ranks)
    return [float(x) for x in flat[:PROBE_NUMEL]]


# World 3 reduces bucket pieces to their owners instead of all-reducing them.
def _each_world_and_stage(test):
    return pytest.mark.parametrize("world", [2, 3])(pytest.mark.parametrize("stage", STAGES)(test))


@pytest.fixture
def probe(world: int, stage: int, tmp_path_factory: pytest.TempPathFactory):
    """The probe's reduced gradient of one variant of the scenario at this world and stage."""
    results = scenario("reduction", tmp_path_factory, world)
    return lambda variant: _values(results[f"{variant}_stage{stage}"], stage)


@_each_world_and_stage
def test_fp16_communication_overflows_without_dividing_first(probe) -> None:
    # 40000 summed over the ranks exceeds float16's range: it only fits when each rank divides
    # its gradient first (by the world size, or by gradient_predivide_factor=2).
    plain = probe("fp16comm")
    assert plain and all(math.isinf(v) for v in plain)
    for variant in ("prescale", "predivide"):
        got = probe(f"fp16comm_{variant}")
        assert got and all(v == pytest.approx(40000.0, rel=1e-3) for v in got), variant


@_each_world_and_stage
def test_bf16_communication_rounds_and_fp32_does_not(probe) -> None:
    exact = 1.0 + 2.0**-10  # needs 10 mantissa bits; bfloat16 has 7
    fp32 = probe("fp32comm")
    bf16 = probe("bf16comm")
    assert fp32 and all(v == pytest.approx(exact, rel=1e-6) for v in fp32)
    assert bf16 and all(v == pytest.approx(1.0, rel=1e-6) for v in bf16)


@_each_world_and_stage
def test_sum_reduction_adds_the_ranks_gradients(world: int, probe) -> None:
    # gradient_allreduce_op="sum": no division by the world size anywhere.
    got = probe("fp32sum")
    want = world * (1.0 + 2.0**-10)
    assert got and all(v == pytest.approx(want, rel=1e-6) for v in got)


def _errors(name: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[float, float, str]:
    """A training variant's worst per-step loss error and worst weight error (and its parameter)
    against the single-process fp32 reference."""
    result = scenario("reduction", tmp_path_factory)[name]
    ref = result["reference"]
    err, param = worst_weight_error(result["weights"], ref["weights"])
    return worst_loss_error(result["losses"], ref["losses"]), err, param


@pytest.mark.parametrize("name", ["train_prescale_stage1", "train_predivide_stage2"])
def test_rescaled_reduction_matches_single_process_adamw(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    loss_err, err, param = _errors(name, tmp_path_factory)
    assert loss_err <= 1e-5
    assert err <= 1e-5, f"{param}: relative error {err:.3e}"


# Stated tolerance: per-step loss and final weights relative to fp32 single-process training.
LOW_PRECISION_COMM = {
    "train_bf16comm_stage1": 2e-3,
    "train_bf16comm_stage2": 2e-3,
    "train_fp16comm_prescale_stage0": 5e-4,
}


@pytest.mark.parametrize("name", sorted(LOW_PRECISION_COMM))
def test_low_precision_communication_tracks_fp32(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tol = LOW_PRECISION_COMM[name]
    loss_err, err, param = _errors(name, tmp_path_factory)
    assert loss_err <= tol
    assert err <= 10 * tol, f"{param}: relative error {err:.3e}"
    # ... and it is visibly not the fp32 result (which matches within 1e-5): the reduction
    # really ran in low precision.
    assert err > 1e-4
