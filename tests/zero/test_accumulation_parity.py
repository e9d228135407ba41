"""Accumulation windows at gloo world 2, ZeRO stages 0-3, against plain PyTorch on the whole
world's micro-batches (rtol 1e-5, atol 1e-6):

* ``managed_gradient_accumulation: false``: windows of 2, 3 and 1 backward passes, each ended by
  the caller's step(), every step applied, ``global_samples`` counting the micro-batches run;
* ``coalesce_grad_reduction()``: three backward passes per step reduce nothing inside the block
  and are reduced on its exit, equal to the same passes reduced one by one (bit for bit at
  stages 0-1, atol 1e-6 at stages 2-3, which add each pass's reduced partition);
* a config unmanaged accumulation refuses is refused on every rank, with no rank left waiting.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from world import run_script

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("accumulation")
    worker = Path(__file__).with_name("accumulation_worker.py")
    run_script(worker, 2, lambda r, port: [str(r), "2", port, str(out)], timeout=240)
    return torch.load(out / "accumulation.pt", weights_only=False)


def _close(got: dict, want: dict, **tol: float) -> None:
    assert got.keys() == want.keys()
    for name in got:
        torch.testing.assert_close(got[name], want[name], msg=name, **tol)  # type: ignore[arg-type]


@pytest.mark.timeout(300)
def test_a_refused_config_is_refused_on_every_rank(result: dict) -> None:
    assert result["refused"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_unmanaged_windows_match_pytorch(result: dict, stage: int) -> None:
    res = result[f"unmanaged{stage}"]
    _close(res["got"], res["want"], rtol=1e-5, atol=1e-6)
    assert res["applied"] == [True, True, True]
    assert res["samples"] == [2 * 2 * 2, 2 * 2 * 5, 2 * 2 * 6]  # micro x ranks x passes so far


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_coalesced_reduction_matches_pytorch_and_separate_reductions(
    result: dict, stage: int
) -> None:
    res = result[f"coalesced{stage}"]
    assert res["inside"] == [0, 0]  # nothing reduced while the block runs
    assert res["reduced_on_exit"] > 0
    _close(res["got"], res["want"], rtol=1e-5, atol=1e-6)
    # Stages 0-1 reduce once per window either way: the same bits. Stages 2-3 reduce every
    # separate pass into the partitions: the same sum in another order.
    _close(res["got"], res["apart"], rtol=0.0, atol=0.0 if stage <= 1 else 1e-6)
