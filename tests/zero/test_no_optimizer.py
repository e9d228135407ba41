"""ZeRO-3 inference at gloo world 2 from an engine built without an optimizer (DeepSpeed's route
for evaluation): partitioned parameters, gathered and released around each forward, give plain
PyTorch's outputs; step() refuses naming how to add an optimizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from world import run_script

pytestmark = pytest.mark.multiprocess


@pytest.mark.timeout(200)
def test_zero3_forward_without_optimizer_matches_pytorch(tmp_path: Path) -> None:
    worker = Path(__file__).with_name("no_optimizer_worker.py")
    run_script(worker, 2, lambda r, port: [str(r), "2", port, str(tmp_path)], timeout=180)
    res = torch.load(tmp_path / "result.pt")
    assert res["optimizer"] == "NoOptimizer()"
    assert 0 < res["local"] < res["whole"]  # rank 0 holds a part of the weights
    for got, want in zip(res["got"], res["want"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert all(res["released"])  # nothing stays gathered after a forward
    assert "step() needs an optimizer" in res["refused"]
    assert "add an 'optimizer' section" in res["refused"]
