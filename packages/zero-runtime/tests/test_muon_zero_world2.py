"""Muon at ZeRO stages 0, 1 and 2 on a gloo world of two equals the single-process Muon on the
whole batches (rtol 1e-4, atol 1e-5: the ranks' averaged gradients differ from the whole
batch's in the last bits, which Newton-Schulz carries into the update)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from world import run_script

pytestmark = pytest.mark.multiprocess


WORKER = Path(__file__).with_name("muon_worker.py")


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Parameters after training: per stage on rank 0, and the single-process reference."""
    saved = tmp_path_factory.mktemp("muon") / "muon.pt"
    run_script(WORKER, 2, lambda r, port: [str(r), "2", port, str(saved.parent)], timeout=240)
    return torch.load(saved, weights_only=False)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_zero_stage_matches_single_process_muon(result: dict, stage: int) -> None:
    got, want = result[stage], result["ref"]
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5, msg=name)
