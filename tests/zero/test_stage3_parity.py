"""Stage 3 across real gloo ranks equals single-process AdamW on the same global batch."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "stage3_launch", Path(__file__).with_name("stage3_launch.py")
)
assert _spec is not None and _spec.loader is not None
launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launch)

STEPS = 30


def _check(results: list[Any], case: dict[str, Any]) -> None:
    worker = launch.load_worker()
    ref_losses, ref_weights = worker.reference(case)
    for res in results:
        torch.testing.assert_close(
            torch.tensor(res["losses"]), torch.tensor(ref_losses), rtol=1e-5, atol=0
        )
        for name, t in ref_weights.items():
            # Tensor-level relative error: elementwise, rarely-used embedding rows let Adam turn
            # reduction-order rounding (1e-9) into 1e-5 absolute noise on single elements.
            err = float((res["weights"][name] - t).norm() / t.norm().clamp_min(1e-12))
            assert err <= 1e-5, f"{name}: relative error {err:.2e}"


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3])
def test_stage3_matches_adamw(world: int, tmp_path: Path) -> None:
    case = {
        "steps": STEPS,
        "global_batch": 6,
        "init": True,
        "limits": {"param_persistence_threshold": 64, "prefetch_bucket_size": 5000},
    }
    _check(launch.run_ranks(case, world, tmp_path), case)
