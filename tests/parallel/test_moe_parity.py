"""``ds.initialize`` with a DeepSpeed-style MoE layer: 10 steps at EP=2 (world 2) and EP=2 x DP=2
(world 4), ZeRO 0-2, equal one process training every expert on the whole batch with the same
gate (each rank's micro-batch gated on its own, dropped tokens included): losses, gradient norms
and every weight within 1e-5 (fp32)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _moe_models import reference  # noqa: E402
from _parity import assert_losses_and_norms, assert_weight_close, world_fixture  # noqa: E402
from _ranks_launch import run_ranks  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def _world(world: int, out: Path, scenarios: list[str]) -> dict[str, dict]:
    run_ranks(HERE / "_moe_worker.py", world, [str(out), *scenarios], timeout=280)
    results = {}
    for s in scenarios:
        where = out / s.replace(":", "-")
        parts = [torch.load(where / f"rank{r}.pt", weights_only=False) for r in range(world)]
        weights: dict[str, torch.Tensor] = {}
        for part in parts:
            for name, w in part["weights"].items():
                if name in weights:  # dense weights and expert replicas agree across ranks
                    torch.testing.assert_close(w, weights[name], rtol=0, atol=0, msg=name)
                weights[name] = w
        results[s] = {"losses": parts[0]["losses"], "norms": parts[0]["norms"], "weights": weights}
    return results


def _assert_same(got: dict, want: dict) -> None:
    assert_losses_and_norms(got, want)
    assert set(got["weights"]) == set(want["weights"])
    for name, w in want["weights"].items():
        assert_weight_close(name, got["weights"][name], w)


# k:ep:stage[:flag]; "resume" saves after 5 steps, loads into zeroed weights and finishes;
# "to1" / "to2" save at this ep_size and finish at ep_size 1 / 2 from the checkpoint (experts
# are stored by global index, so the checkpoint reshards).
WORLD2 = ["1:2:0", "2:2:1", "1:2:2:residual", "2:2:2:resume", "1:2:1:to1", "2:1:2:to2"]
WORLD4 = ["1:2:0", "2:2:1", "2:2:2", "1:2:2:residual"]


world2 = world_fixture(_world, 2, WORLD2)
world4 = world_fixture(_world, 4, WORLD4)


def _want(scenario: str, ranks: int) -> dict:
    k, _ep, _stage, *flag = scenario.split(":")
    return reference(int(k), flag == ["residual"], ranks)


@pytest.mark.parametrize("scenario", WORLD2)
def test_ep2_matches_one_process(world2: dict[str, dict], scenario: str) -> None:
    _assert_same(world2[scenario], _want(scenario, 2))


@pytest.mark.slow
@pytest.mark.parametrize("scenario", WORLD4)
def test_ep2_x_dp2_matches_one_process(world4: dict[str, dict], scenario: str) -> None:
    _assert_same(world4[scenario], _want(scenario, 4))
