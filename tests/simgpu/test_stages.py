"""ZeRO stages 0-3 at world 8 on simulated GPUs: placement, collective discipline, host syncs.

Each case trains two optimizer steps (two micro-steps each) on eight ranks, each on its own fake
``cuda:r``. ``run_world`` fails the case on any op mixing devices, any host tensor handed to a
collective, and any disagreement between the ranks' collectives; the tests add the placement of
the state the stage keeps and the host-sync budget (one per optimizer step: the overflow/norm read).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _world import budget_syncs, config, device_syncs, train

pytestmark = [pytest.mark.simgpu, pytest.mark.slow]  # 30-60 s a case on 2 loaded cores

CASES = [
    (0, "fp32", "none"),
    (0, "bf16", "none"),
    (0, "fp16", "none"),
    (1, "bf16", "none"),
    (1, "fp16", "cpu"),
    (2, "fp32", "none"),
    (2, "bf16", "cpu"),
    (2, "fp16", "none"),
]


def _placement(ctx: Any, engine: Any) -> dict[str, Any]:
    strategy = engine.strategy
    masters = [g.master for g in strategy.groups]
    state = [
        t
        for m in masters
        for t in engine.optimizer.state.get(m, {}).values()
        if isinstance(t, torch.Tensor) and t.numel() > 1
    ]
    return {
        "params": {str(p.device) for p in engine.module.parameters()},
        "masters": {str(m.device) for m in masters},
        "state": {str(t.device) for t in state},
        "device": str(ctx.device),
        "steps": engine.global_steps,
    }


@pytest.mark.parametrize(("stage", "precision", "offload"), CASES)
def test_stage_on_eight_simulated_gpus(stage: int, precision: str, offload: str) -> None:
    result = train(config(stage, precision, offload), inspect=_placement)
    for rank, got in enumerate(result.values()):
        assert got["steps"] == 2
        assert got["device"] == f"cuda:{rank}"
        assert got["params"] == {got["device"]}
        host = {"cpu"} if offload == "cpu" else {got["device"]}
        assert got["masters"] == host and got["state"] == host
    # At most one host sync per optimizer step: reading the global norm / overflow flag.
    syncs = budget_syncs(result) if offload != "none" else device_syncs(result)
    assert len(syncs) <= 2, syncs
    traffic = result.ranks[0].traffic
    if stage >= 1:
        # NCCL rules: the updated partitions come back by all_gather_into_tensor, never by
        # unbatched point-to-point sends.
        assert traffic.get("all_gather_into_tensor", 0) > 0
        assert "send" not in traffic and "recv" not in traffic


STAGE3 = [
    ("fp32", {}),
    ("bf16", {"offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}),
    ("fp16", {"offload_optimizer": {"device": "nvme", "nvme_path": "/tmp/ds-simgpu-nvme"}}),
]


def _params_on(ctx: Any, engine: Any) -> dict[str, Any]:
    engine.synchronize_parameters()
    return {"steps": engine.global_steps, "device": str(ctx.device)}


@pytest.mark.parametrize(("precision", "zero"), STAGE3, ids=["fp32", "bf16-offload", "fp16-nvme"])
def test_stage3_on_eight_simulated_gpus(precision: str, zero: dict[str, Any]) -> None:
    result = train(config(3, precision, **zero), inspect=_params_on)
    for rank, got in enumerate(result.values()):
        assert got == {"steps": 2, "device": f"cuda:{rank}"}
    syncs = budget_syncs(result) if "offload_optimizer" in zero else device_syncs(result)
    assert len(syncs) <= 2, syncs
