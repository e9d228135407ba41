"""With overlap_comm, stages 1-2 leave the parameter all-gather in flight when step() returns and
reading the weights through the engine completes it first; without it, the module's weights are
whole when step() returns (gloo world of 2)."""

from __future__ import annotations

import pytest
from _compare import worst_weight_error

from conftest import scenario

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.mark.parametrize("stage", [1, 2])
def test_engine_parameters_wait_for_the_gather(
    stage: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    result = scenario("lazy_gather", tmp_path_factory)[f"stage{stage}"]
    assert result["in_flight"]  # the gather really was still pending after step()
    ref = result["reference"]
    err, param = worst_weight_error(result["named"], ref["weights"])
    assert err <= 1e-5, f"{param}: relative error {err:.3e}"


@pytest.mark.parametrize("stage", [1, 2])
def test_without_overlap_comm_weights_are_whole_after_step(
    stage: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    result = scenario("lazy_gather", tmp_path_factory)[f"stage{stage}_sync"]
    assert not result["in_flight"]
    ref = result["reference"]
    err, param = worst_weight_error(result["named"], ref["weights"])
    assert err <= 1e-5, f"{param}: relative error {err:.3e}"
