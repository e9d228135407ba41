"""bf16/fp16 training tracks fp32, a forced fp16 overflow skips exactly that step, and per-rank
optimizer-state and gradient bytes shrink with the stage by construction (gloo world of 2)."""

from __future__ import annotations

import pytest
import torch

from conftest import scenario

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(420)]

WORLD = 2
# Stated tolerances: per-step loss relative to the fp32 single-process run over 30 steps.
TOLERANCE = {"bf16": 2e-3, "fp16": 5e-4}


@pytest.mark.parametrize("name", ["bf16_stage0", "bf16_stage2", "fp16_stage1", "fp16_stage2"])
def test_low_precision_tracks_fp32(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    result = scenario("precision", tmp_path_factory)[name]
    kind = name.split("_")[0]
    assert result["dtype"] == {"bf16": "torch.bfloat16", "fp16": "torch.float16"}[kind]
    ref = result["reference"]["losses"]
    worst = max(abs(a - b) / b for a, b in zip(result["losses"], ref))
    assert worst <= TOLERANCE[kind]
    assert result["skipped"] == 0


def test_forced_fp16_overflow_skips_exactly_that_step(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    result = scenario("precision", tmp_path_factory)["overflow"]
    snaps = result["snapshots"]  # weights seen at the start of each step 0..13
    assert result["skipped"] == 1
    assert result["global_steps"] == 14
    for step in range(13):
        same = all(torch.equal(snaps[step][n], snaps[step + 1][n]) for n in snaps[step])
        assert same == (step == 10), f"step {step}: weights {'unchanged' if same else 'changed'}"
    scales = result["scales"]
    assert scales[10] == 256.0 and scales[11] == 128.0  # hysteresis 1: halved at once
    assert scales[:10] == [256.0] * 10 and scales[12:] == [128.0, 128.0]


def _partition(numel: int) -> int:
    return -(-numel // WORLD)


def test_optimizer_state_is_partitioned(tmp_path_factory: pytest.TempPathFactory) -> None:
    results = scenario("precision", tmp_path_factory)
    numel = results["memory_stage0"]["numel"]
    padded = _partition(numel) * WORLD
    for rank in results["memory_stage0"]["ranks"]:
        assert rank["optimizer_state_bytes"] == 2 * 4 * padded
    for key in ("memory_stage1", "memory_stage2", "memory_stage2_offload"):
        for rank in results[key]["ranks"]:
            # Adam: two fp32 moments over this rank's partition only.
            assert rank["optimizer_state_bytes"] == 2 * 4 * _partition(numel)
            assert rank["state_shapes"] == [(_partition(numel),)] * 2


def test_stage2_keeps_only_its_gradient_partition(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    results = scenario("precision", tmp_path_factory)
    numel = results["memory_stage2"]["numel"]
    for key in ("memory_stage2", "memory_stage2_offload"):
        for rank in results[key]["ranks"]:
            assert rank["gradient_bytes"] == 4 * _partition(numel)
            assert rank["grads_kept_after_backward"] == 0  # no full .grad survives backward
    for rank in results["memory_stage1"]["ranks"]:
        assert rank["gradient_bytes"] == 4 * _partition(numel) * WORLD
        assert rank["grads_kept_after_backward"] == numel
    for rank in results["memory_stage2_offload"]["ranks"]:
        assert rank["master_weight_bytes"] == 4 * _partition(numel)  # host fp32 master partition
