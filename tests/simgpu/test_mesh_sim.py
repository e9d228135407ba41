"""``ds.initialize`` on a tensor/sequence-parallel mesh at world 8 on simulated GPUs: every
tensor on its rank's device, every collective under NCCL's rules and in the same order on the
ranks of each group, and the mesh's groups carrying the traffic they should."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tiny_models import llama_shape

import ds.full as ds
from ds.sim.world import RankContext, run_world

pytestmark = [pytest.mark.simgpu, pytest.mark.slow]

transformers = pytest.importorskip("transformers")

SEQ, MICRO = 16, 2


def tiny_llama() -> Any:
    torch.manual_seed(0)
    shape = llama_shape(32, 64, heads=4, kv_heads=4, vocab=64, positions=64)
    cfg = transformers.LlamaConfig(**shape, attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(cfg)


def config(tp: int, sp: int, stage: int) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": stage},
        "tensor_parallel": {"autotp_size": tp},
        "sequence_parallel_size": sp,
    }


def _run(tp: int, sp: int, stage: int) -> Any:
    def body(ctx: RankContext) -> Any:
        from ds import comm as dist
        from ds.parallel.sequence import sequence_parallel_loss, shard_batch

        engine, *_ = ds.initialize(model=tiny_llama(), config=config(tp, sp, stage))
        mesh = engine.mesh
        ids = torch.randint(0, 64, (MICRO, SEQ), generator=torch.Generator().manual_seed(1))
        for _ in range(2):
            if sp > 1:
                part = shard_batch({"input_ids": ids, "labels": ids}, mesh.index("sp"), sp)
                part = {k: v.to(ctx.device) for k, v in part.items()}
                logits = engine(
                    input_ids=part["input_ids"], position_ids=part["position_ids"]
                ).logits
                loss = sequence_parallel_loss(
                    logits, part["shift_labels"], dist.get_communicator(), mesh.group("sp")
                ).loss
            else:
                x = ids.to(ctx.device)
                loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()
        placed = {str(p.device) for p in engine.module.parameters() if p.device.type != "meta"}
        out = {"placed": placed, "device": str(ctx.device), "mesh": mesh.describe()}
        engine.destroy()
        return out

    return run_world(body, 8)


@pytest.mark.parametrize(
    ("tp", "sp", "stage"),
    [pytest.param(2, 1, 2, id="tp2xdp4-zero2"), pytest.param(1, 4, 3, id="sp4xdp2-zero3")],
)
def test_mesh_at_world_8_places_and_orders_collectives(tp: int, sp: int, stage: int) -> None:
    result = _run(tp, sp, stage)  # run_world checks the ranks' collectives agree
    for rank in result.ranks:
        assert rank.value["placed"] <= {rank.value["device"]}, rank.value
    ops = [op for r in result.ranks for op in result.world.trace(r.rank)]
    # Rooted collectives name a member of their group as a global rank (reduce-to-owner on a
    # sub-group once named the owner by its group rank).
    for op in ops:
        assert op.root < 0 or op.root in op.group, op.describe()
    by_kind: dict[str, set[tuple[int, ...]]] = {}
    for op in ops:
        by_kind.setdefault(op.kind, set()).add(op.group)
    if tp > 1:
        # AutoTP's all-reduces inside the adjacent pairs; ZeRO's reductions over dp (x sp).
        assert {(0, 1), (2, 3), (4, 5), (6, 7)} <= by_kind["all_reduce"], by_kind
        zero = by_kind.get("reduce", set()) | by_kind.get("reduce_scatter_tensor", set())
        assert zero and zero <= {(0, 2, 4, 6), (1, 3, 5, 7)}, by_kind
    else:
        # Ulysses' all-to-alls inside the SP groups only; ZeRO-3 over all 8 (dp x sp).
        assert by_kind["all_to_all_single"] == {(0, 1, 2, 3), (4, 5, 6, 7)}, by_kind
        assert by_kind["reduce_scatter_tensor"] == {tuple(range(8))}, by_kind
