"""Pipeline x tensor parallelism PP=2 x TP=2 x DP=2 on eight simulated GPUs: placement, AutoTP's
slices on each stage and NCCL discipline (GPipe and 1F1B, ZeRO-1, bf16).

Ranks 0-3 are stage 0 and 4-7 stage 1; inside a stage the TP pairs are adjacent ((0, 1), (2, 3))
and dp pairs equal TP indices ((0, 2), (1, 3)); the pp group pairs rank r with r + 4, so every
send and receive goes between matching TP ranks. The interleaved schedule is left to the gloo
tests, as in test_pipeline_sim.py (its last stage feeds the first, which a world run one rank
after another cannot order).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

import ds.full as ds
from ds.sim.world import RankContext, run_world

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))
from _pipe_gpt import DIM, SEQ, VOCAB, TPBlock, pipeline_module

pytestmark = pytest.mark.simgpu

WORLD, PP, TP, MICRO, GAS = 8, 2, 2, 2, 2

# AutoTP's slice of each TPBlock weight at TP=2 (q/k/v/up column-wise, o/down row-wise); the
# layer norms and the row-parallel biases stay whole.
SLICED = {
    "q_proj.weight": (DIM // TP, DIM),
    "k_proj.weight": (DIM // TP, DIM),
    "v_proj.weight": (DIM // TP, DIM),
    "o_proj.weight": (DIM, DIM // TP),
    "o_proj.bias": (DIM,),
    "up_proj.weight": (4 * DIM // TP, DIM),
    "up_proj.bias": (4 * DIM // TP,),
    "down_proj.weight": (DIM, 4 * DIM // TP),
    "down_proj.bias": (DIM,),
}


def _body(schedule: str, ctx: RankContext) -> Any:
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GAS,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "bf16": {"enabled": True},
        # The global norm adds sliced gradients over tp, then the stages over pp.
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 1},
        "pipeline": {"stages": PP, "schedule": schedule},
        "tensor_parallel": {"autotp_size": TP},
    }
    engine, *_ = ds.initialize(model=pipeline_module(PP, block=TPBlock), config=cfg)
    for _ in range(2):
        ids = torch.randint(0, VOCAB, (MICRO, SEQ)).to(ctx.device)
        engine.train_batch(iter([(ids, ids)] * GAS))
    mesh = engine.mesh
    shapes = {n: tuple(p.shape) for n, p in engine.module.named_parameters()}
    devices = {str(p.device) for p in engine.module.parameters()}
    out = {
        "devices": devices,
        "shapes": shapes,
        "groups": {d: mesh.ranks(d) for d in ("pp", "tp", "dp")},
        "steps": engine.global_steps,
    }
    engine.destroy()
    return out


def _groups(rank: int) -> dict[str, tuple[int, ...]]:
    """The mesh's groups of ``rank``: pp outermost, then dp, tp innermost."""
    per_stage = WORLD // PP
    stage, tp_index = rank // per_stage, rank % TP
    return {
        "pp": tuple(range(rank % per_stage, WORLD, per_stage)),
        "tp": (rank - tp_index, rank - tp_index + 1),
        "dp": tuple(range(stage * per_stage + tp_index, (stage + 1) * per_stage, TP)),
    }


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pp2_x_tp2_x_dp2_places_slices_and_orders_collectives(schedule: str) -> None:
    # run_world raises on a host tensor in any collective or p2p call, and on ranks whose
    # collectives or sends and receives do not match or deadlock when replayed.
    result = run_world(partial(_body, schedule), WORLD)
    blocks: set[str] = set()
    for rank, value in enumerate(result.values()):
        assert value["devices"] == {f"cuda:{rank}"} and value["steps"] == 2, value
        assert value["groups"] == _groups(rank), value["groups"]
        for name, shape in value["shapes"].items():
            layer, _, leaf = name.partition(".")
            if leaf in SLICED:
                assert shape == SLICED[leaf], (rank, name, shape)
                blocks.add(layer)
    assert len(blocks) == 4, blocks  # every block split, on one stage or the other
    for rank in range(WORLD):
        mine = _groups(rank)
        kinds: dict[str, set[tuple[int, ...]]] = {}
        for op in result.world.trace(rank):
            for item in op.items or (op,):
                if item.kind in ("send", "recv"):
                    # Activations and gradients go between matching TP (and dp) ranks only.
                    assert {rank, item.root} == set(mine["pp"]), item.describe()
                else:
                    assert item.group in mine.values(), item.describe()
                kinds.setdefault(item.kind, set()).add(item.group)
        assert {"send", "recv"} & set(kinds), kinds
        assert mine["tp"] in kinds["all_reduce"], kinds  # the row-parallel projections
        # ZeRO-1 reduces and gathers over the stage's dp ranks only.
        assert kinds["reduce"] == kinds["all_gather_into_tensor"] == {mine["dp"]}, kinds
